import json
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.preflight.main import training_preflight, validate_project_config
from deepdanbooru.preflight.probes import satisfies
from deepdanbooru.project.tags import tags_hash

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
PROJECT_CHECKS = ["config", "tags", "model", "database", "eligible", "md5", "shards", "images", "labels", "duplicates",
                  "split", "checkpoint", "lock"]


def statuses(results):
    return {r.name: r.status for r in results}


def detail(results, name):
    return next(r.detail for r in results if r.name == name)


def only_failure(results, name):
    """Exactly `name` failed; the checks that need it are skipped, the others pass."""
    failed = [r.name for r in results if r.status == "FAIL"]
    assert failed == [name], [(r.name, r.status, r.detail) for r in results]
    return detail(results, name)


@pytest.fixture
def project(tmp_path, sample_dataset):
    """A project with its own copy of the sample dataset, free to break."""
    database, tags = sample_dataset
    dataset = tmp_path / "dataset"
    shutil.copytree(database.parent, dataset)
    root = tmp_path / "project"
    root.mkdir()
    write_config(root, {"image_width": 32, "image_height": 32, "database_path": "../dataset/dataset.sqlite",
                        "minimum_tag_count": 1, "model": "resnet_small", "minibatch_size": 4})
    (root / "tags.txt").write_text("\n".join(tags) + "\n")
    return root


def write_config(root, config):
    (root / "project.json").write_text(json.dumps(config))


def edit_config(root, **changes):
    config = json.loads((root / "project.json").read_text())
    config.update(changes)
    write_config(root, config)


def database_of(root):
    return root.parent / "dataset" / "dataset.sqlite"


def execute(root, sql, parameters=()):
    connection = sqlite3.connect(database_of(root))
    with connection:
        rows = connection.execute(sql, parameters).fetchall()
    connection.close()
    return rows


def image_of(root, post_id):
    md5, ext = execute(root, "SELECT md5, file_ext FROM posts WHERE id = ?", (post_id,))[0]
    # as preflight derives it: database_path is relative to the project
    return root / ".." / "dataset" / "images" / md5[:2] / f"{md5}.{ext}"


def snapshot(*directories):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for d in directories for p in sorted(Path(d).rglob("*"))}


# --- a good project ---------------------------------------------------------------


def test_good_project_passes_every_check_and_writes_nothing(sample_project, sample_dataset):
    before = snapshot(sample_project, sample_dataset[0].parent)
    results = training_preflight(sample_project)
    assert [r.name for r in results] == PROJECT_CHECKS
    # 24 posts are too few for one of the sample's tags: the only warning.
    assert all(r.status == "PASS" for r in results if r.name != "split"), results
    assert statuses(results)["split"] == "WARN"
    assert detail(results, "split") == (
        "24 training and 0 validation posts (validation_fraction 0); results cannot be trusted: 1 tag of 17 has "
        "fewer than 5 positive examples among the 24 training posts and cannot be learnt; add posts or drop rare "
        "tags from tags.txt (make-tags --minimum-post-count)")
    assert detail(results, "eligible") == \
        "24 eligible posts of 24 (file_ext in (png, jpg, jpeg) and tag_count_general >= 1)"
    assert detail(results, "images") == "checked the first 20 of 24 eligible images (by id): jpeg 20; 32x32"
    assert "starts FRESH" in detail(results, "checkpoint")
    assert snapshot(sample_project, sample_dataset[0].parent) == before


def test_max_image_checks_bounds_the_sample_and_zero_means_all(sample_project):
    assert detail(training_preflight(sample_project, max_image_checks=5), "images").startswith(
        "checked the first 5 of 24 eligible images (by id): jpeg 5")
    assert detail(training_preflight(sample_project, max_image_checks=0), "images").startswith(
        "checked all 24 eligible images: jpeg 24")


# --- each kind of broken project ------------------------------------------------------


def test_bad_config_value_fails_config_and_skips_what_needs_it(project):
    edit_config(project, minibatch_size=0)
    results = training_preflight(project)
    message = only_failure(results, "config")
    assert message == f"{project / 'project.json'}: minibatch_size: must be >= 1, got 0"
    assert statuses(results)["database"] == "SKIP" and statuses(results)["images"] == "SKIP"
    assert statuses(results)["tags"] == "PASS"


def test_model_check_reports_size_and_refuses_a_too_small_input(project):
    from deepdanbooru.models.table import parameter_counts
    results = training_preflight(project)
    trainable, frozen = parameter_counts("resnet_small", (32, 32, 3), 17)
    assert detail(results, "model") == (
        f"resnet_small: input 32x32x3, 17 outputs, {trainable:,} trainable and {frozen:,} non-trainable parameters")
    edit_config(project, model="resnet_152")
    message = only_failure(training_preflight(project), "model")
    assert message.startswith(f"{project / 'project.json'}: image_width/image_height: resnet_152 needs an input of at least")
    edit_config(project, model="resnet_small", head_bias_init="log_prior")
    message = only_failure(training_preflight(project), "model")
    assert message.startswith(f"{project / 'project.json'}: head_bias_init: log_prior sets the output bias, but "
                              "resnet_small's head")


def test_invalid_json_fails_config(project):
    (project / "project.json").write_text("{\"model\": ")
    assert "invalid JSON at line 1" in only_failure(training_preflight(project), "config")


def test_unknown_key_is_a_warning_and_a_misspelt_one_fails(project):
    edit_config(project, notes="resnet_small")
    results = training_preflight(project)
    assert statuses(results)["config"] == "WARN"
    assert "unknown key 'notes' is ignored" in detail(results, "config")
    assert "FAIL" not in statuses(results).values()
    edit_config(project, modle="resnet_small")
    assert "modle: unknown key; did you mean 'model'?" in only_failure(training_preflight(project), "config")


def test_every_config_error_is_reported_at_once_with_the_right_key(project):
    edit_config(project, epochs=30, lr=0.01, image_size=64, model="resnet_smal")
    problems = only_failure(training_preflight(project), "config")
    source = project / "project.json"
    assert problems.startswith(f"4 problems: {source}: model: must be one of")
    assert f"{source}: epochs: unknown key; another tool's name; deepdanbooru's is epoch_count" in problems
    assert f"{source}: lr: unknown key; another tool's name; deepdanbooru's is learning_rate" in problems
    assert f"{source}: image_size: unknown key; another tool's name; deepdanbooru's is image_width and " \
           "image_height" in problems


def test_a_tags_txt_line_in_no_post_is_named(project):
    with open(project / "tags.txt", "a") as stream:
        stream.write("long_hiar\n")
    results = training_preflight(project)
    assert statuses(results)["split"] == "WARN"
    assert "1 tag of tags.txt occurs in no eligible post: 'long_hiar' (misspelt, or only on posts training does " \
           "not use?)" in detail(results, "split")


@pytest.mark.parametrize("text, message", [
    ("\n  \n", "holds no tags"),
    ("circle\nsquare\ncircle\n", "line 3: duplicate tag 'circle' (first on line 1)"),
])
def test_empty_or_duplicate_tags_fail_tags(project, text, message):
    (project / "tags.txt").write_text(text)
    results = training_preflight(project)
    assert message in only_failure(results, "tags")
    assert statuses(results)["labels"] == "SKIP"


def test_missing_tags_file_fails_tags(project):
    (project / "tags.txt").unlink()
    assert only_failure(training_preflight(project), "tags") == f"{project / 'tags.txt'}: not found"


def test_missing_database_file_fails_database(project):
    database_of(project).unlink()
    assert "database_path: file not found" in only_failure(training_preflight(project), "database")


def test_null_database_path_fails_database(project):
    edit_config(project, database_path=None)
    assert "database_path: is null" in only_failure(training_preflight(project), "database")


def test_missing_posts_table_fails_database(project):
    execute(project, "ALTER TABLE posts RENAME TO old_posts")
    results = training_preflight(project)
    assert only_failure(results, "database").endswith("dataset.sqlite: posts: table not found")
    assert statuses(results)["eligible"] == "SKIP"


def test_renamed_column_fails_database_naming_it(project):
    execute(project, "ALTER TABLE posts RENAME COLUMN tag_string TO tags")
    assert only_failure(training_preflight(project), "database").endswith("posts: missing column(s): tag_string")


def test_not_a_database_fails_database(project):
    database_of(project).write_bytes(b"this is not sqlite" * 100)
    assert "not a readable SQLite database" in only_failure(training_preflight(project), "database")


def test_no_eligible_rows_fails_eligible_and_says_why(project):
    edit_config(project, minimum_tag_count=50)
    results = training_preflight(project)
    message = only_failure(results, "eligible")
    assert "no eligible posts (file_ext in (png, jpg, jpeg) and tag_count_general >= 50)" in message
    assert "24 posts, 24 with an eligible file_ext, none of them with enough tags" in message
    assert statuses(results)["md5"] == "SKIP" and statuses(results)["images"] == "SKIP"


def test_extension_outside_image_extensions_is_not_eligible(project):
    execute(project, "UPDATE posts SET file_ext = 'tiff'")
    assert "0 with an eligible file_ext" in only_failure(training_preflight(project), "eligible")


@pytest.mark.parametrize("md5, reason", [
    ("../../etc/passwd", "is not a safe file name"),
    ("ab/cd", "is not a safe file name"),
    ("", "md5 is empty"),
])
def test_unsafe_md5_fails_md5_naming_the_row(project, md5, reason):
    execute(project, "UPDATE posts SET md5 = ? WHERE id = 23", (md5,))
    results = training_preflight(project)
    message = only_failure(results, "md5")
    assert message.startswith("1 eligible post(s) unusable; first: ")
    assert "posts row id 23: " in message and reason in message
    assert statuses(results)["images"] == "PASS"  # id 23 is outside the sample of 20


def test_unsafe_md5_inside_the_sample_is_not_turned_into_a_path(project):
    execute(project, "UPDATE posts SET md5 = '../x' WHERE id = 2")
    results = training_preflight(project)
    assert "posts row id 2" in only_failure(results, "md5")
    assert detail(results, "images") == "checked the first 20 of 24 eligible images (by id): jpeg 19; 32x32"


def test_missing_image_fails_images_naming_id_and_path(project):
    path = image_of(project, 3)
    path.unlink()
    message = only_failure(training_preflight(project), "images")
    assert message == f"1 unusable among the first 20 of 24 eligible images (by id): id 3 {path}: file not found"


def test_missing_images_folder_fails_images(project):
    shutil.rmtree(project.parent / "dataset" / "images")
    assert "images folder not found beside the database" in only_failure(training_preflight(project), "images")


def test_corrupt_images_fail_images_with_each_reason(project):
    truncated, empty, text = image_of(project, 2), image_of(project, 5), image_of(project, 9)
    truncated.write_bytes(truncated.read_bytes()[:-40])
    empty.write_bytes(b"")
    text.write_text("<html>not found</html>")
    message = only_failure(training_preflight(project), "images")
    assert message.startswith("3 unusable among the first 20 of 24")
    assert f"id 2 {truncated}: truncated JPEG: no end-of-image marker" in message
    assert f"id 5 {empty}: empty file (0 bytes)" in message
    assert f"id 9 {text}: not an image: unknown signature" in message


def test_bad_images_beyond_three_are_counted(project):
    for post_id in range(1, 6):
        image_of(project, post_id).write_bytes(b"")
    results = training_preflight(project)
    message = only_failure(results, "images")
    assert message.startswith("5 unusable among") and message.endswith("; and 2 more (--format json lists every one)")
    (images,) = [result for result in results if result.name == "images"]
    assert [item.split(":")[0] for item in images.items] == [f"id {n} {image_of(project, n)}" for n in range(1, 6)]


def test_image_over_the_pixel_limit_fails_images(project):
    edit_config(project, max_image_pixels=1000)
    message = only_failure(training_preflight(project), "images")
    assert "32x32 = 1,024 pixels is over max_image_pixels 1,000" in message


def test_content_that_does_not_match_the_extension_is_a_warning(project):
    path = image_of(project, 4)
    from PIL import Image
    with Image.open(path) as image:
        image.save(path, format="PNG")
    results = training_preflight(project)
    assert statuses(results)["images"] == "WARN"
    assert f"1 whose extension does not match the content: id 4 {path} holds PNG" in detail(results, "images")


def test_posts_without_a_known_tag_are_a_warning(project):
    execute(project, "UPDATE posts SET tag_string = 'unknown_tag' WHERE id IN (1, 2)")
    results = training_preflight(project)
    assert statuses(results)["labels"] == "WARN"
    assert "2 have no tag from tags.txt and train as all-negative (ids 1, 2)" in detail(results, "labels")


# --- checkpoint state -------------------------------------------------------------


def write_checkpoint(root, name="ckpt-3", data=True, state=None):
    directory = root / "checkpoints"
    directory.mkdir(exist_ok=True)
    (directory / "checkpoint").write_text(
        f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    (directory / f"{name}.index").write_bytes(b"index")
    if data:
        (directory / f"{name}.data-00000-of-00001").write_bytes(b"data")
    if state is not None:
        (directory / "state.json").write_text(json.dumps(state))
    return directory


def trainer_state(project, **changes):
    """state.json as runstate/state.py writes it (version 1)."""
    tags = (project / "tags.txt").read_text().split()
    state = {"version": 1, "checkpoint": "ckpt-3", "used_epoch": 1, "used_minibatch": 12, "used_sample": 48,
             "offset": 8, "random_seed": 1, "epoch_bad_images": 0, "complete": False, "model": "resnet_small",
             "image_height": 32, "image_width": 32, "tags_hash": tags_hash(tags), "tag_count": len(tags),
             "epoch_count": 10, "train_records": 24}
    state.update(changes)
    return state


def test_checkpoint_says_the_next_run_resumes_with_the_counters(project):
    directory = write_checkpoint(project, state=trainer_state(project))
    results = training_preflight(project)
    assert statuses(results)["checkpoint"] == "PASS"
    assert detail(results, "checkpoint") == (
        f"the next train-project will RESUME from {directory / 'ckpt-3'}: used_epoch=1 used_minibatch=12 "
        "used_sample=48 offset=8 random_seed=1 (1 of 10 epoch(s) done, 8 of 24 records into epoch 2)")


def test_a_fully_trained_epoch_counts_as_done(project):
    """The last checkpoint of an epoch holds offset = train records: preflight reads it as the epoch end."""
    write_checkpoint(project, state=trainer_state(project, used_epoch=2, offset=24, random_seed=2))
    assert detail(training_preflight(project), "checkpoint").endswith(
        ": used_epoch=3 used_minibatch=12 used_sample=48 offset=0 random_seed=3 (3 of 10 epoch(s) done)")


def test_checkpoint_without_state_file_still_says_resume(project):
    directory = write_checkpoint(project)
    assert detail(training_preflight(project), "checkpoint") == (
        f"the next train-project will RESUME from {directory / 'ckpt-3'} (no state.json to show its counters)")


@pytest.mark.parametrize("used_epoch, offset", [(2, 0), (1, 24)])
def test_finished_training_is_explained(project, used_epoch, offset):
    edit_config(project, epoch_count=2)
    write_checkpoint(project, state=trainer_state(project, used_epoch=used_epoch, offset=offset, complete=True))
    assert "all 2 epoch(s) are trained, so it only exports the final model again (raise epoch_count to train on)" \
        in detail(training_preflight(project), "checkpoint")


def test_epoch_count_fit_is_described_and_reads_the_plan_from_the_state(project):
    edit_config(project, epoch_count="fit", lr_schedule="warmup_cosine")
    write_checkpoint(project, state=trainer_state(project, epoch_count=12))
    results = training_preflight(project)
    assert statuses(results)["config"] == "PASS"
    assert detail(results, "config").endswith(
        ', minibatch 4, epoch_count "fit": train-project plans the epochs from its --time-limit, which it then '
        "needs (again at each resume)")
    assert detail(results, "checkpoint").endswith("(1 of 12 epoch(s) done, 8 of 24 records into epoch 2)")
    write_checkpoint(project, state=trainer_state(project, epoch_count=2, used_epoch=2, offset=0, complete=True))
    assert ("all 2 epoch(s) are trained, so it only exports the final model again (set epoch_count to a number "
            "above 2 to train on)") in detail(training_preflight(project), "checkpoint")


def test_checkpoint_with_missing_files_fails(project):
    write_checkpoint(project, data=False)
    assert "names ckpt-3, but its .index or .data files are missing" in only_failure(
        training_preflight(project), "checkpoint")


def test_checkpoint_for_another_model_input_or_vocabulary_fails(project):
    write_checkpoint(project, state=trainer_state(project, model="resnet_152", image_width=64, tags_hash="0" * 64))
    message = only_failure(training_preflight(project), "checkpoint")
    assert ("trained for model resnet_152 (project.json: resnet_small), input 32x64 (project.json: 32x32), "
            "a different tags.txt: train-project will refuse to resume") in message


def test_state_file_of_an_older_checkpoint_is_a_warning(project):
    write_checkpoint(project, state=trainer_state(project, checkpoint="ckpt-2"))
    results = training_preflight(project)
    assert statuses(results)["checkpoint"] == "WARN"
    assert "state.json describes ckpt-2, not the latest checkpoint ckpt-3" in detail(results, "checkpoint")


@pytest.mark.parametrize("content, problem", [
    ("{broken", "state.json: cannot be read"),
    ('{"version": 99}', "state.json: version 99 is not one this version of deepdanbooru reads"),
])
def test_unreadable_state_file_is_a_warning(project, content, problem):
    write_checkpoint(project).joinpath("state.json").write_text(content)
    results = training_preflight(project)
    assert statuses(results)["checkpoint"] == "WARN" and problem in detail(results, "checkpoint")


def test_lock_held_by_a_live_process_is_a_warning(project):
    (project / ".train.lock").write_text(json.dumps({"pid": os.getpid(), "hostname": socket.gethostname()}))
    results = training_preflight(project)
    assert statuses(results)["lock"] == "WARN"
    assert f"held by pid {os.getpid()} on host {socket.gethostname()}" in detail(results, "lock")
    assert "FAIL" not in statuses(results).values()
    (project / ".train.lock").write_text("")
    assert statuses(training_preflight(project))["lock"] == "WARN"


def test_lock_left_by_a_dead_process_will_be_taken_over(project):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)
    (project / ".train.lock").write_text(json.dumps({"pid": dead, "hostname": socket.gethostname()}))
    results = training_preflight(project)
    assert statuses(results)["lock"] == "PASS"
    assert "which is no longer running; the next train-project takes it over" in detail(results, "lock")


# --- validate_project_config ----------------------------------------------------------


def test_validate_project_config_checks_paths_only_when_asked(project):
    database_of(project).unlink()
    assert statuses(validate_project_config(project)) == {"config": "PASS"}
    results = validate_project_config(project, check_paths=True)
    assert statuses(results) == {"config": "PASS", "tags": "PASS", "paths": "FAIL"}
    assert "database_path: file not found" in detail(results, "paths")


def test_check_paths_wants_backbone_weights_until_a_checkpoint_exists(project):
    config = json.loads((project / "project.json").read_text())
    (project / "project.json").write_text(json.dumps(dict(config, backbone_weights="trunk.weights.h5")))
    results = validate_project_config(project, check_paths=True)
    assert statuses(results)["paths"] == "FAIL"
    assert f"{project / 'project.json'}: backbone_weights: file not found: {project / 'trunk.weights.h5'}" \
        in detail(results, "paths")
    (project / "checkpoints").mkdir(exist_ok=True)
    (project / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert statuses(validate_project_config(project, check_paths=True))["paths"] == "PASS"


# --- packages ---------------------------------------------------------------------------


@pytest.mark.parametrize("version, specifier, expected", [
    ("2.21.0", ">=2.21,<2.22", True),
    ("2.22.1", ">=2.21,<2.22", False),
    ("2.20.9", ">=2.21,<2.22", False),
    ("3.15.1", ">=3.15,<4", True),
    ("13.0.0", ">=10,<14", True),
    ("14.0", ">=10,<14", False),
    ("2.21.0rc1", "==2.21.0", True),
    ("1.4.2", "~=1.4", True),
    ("2.0", "~=1.4", False),
    ("1.0", "", True),
])
def test_version_specifiers(version, specifier, expected):
    assert satisfies(version, specifier) is expected


def test_check_packages_reports_installed_versions(sample_project):
    results = training_preflight(sample_project, check_packages=True)
    packages = {r.name: r for r in results if r.name.startswith("package ")}
    assert set(packages) == {"package tensorflow", "package keras", "package click", "package numpy", "package pillow"}
    import click
    assert packages["package click"].status == "PASS"
    assert packages["package click"].detail.startswith(f"click {click.__version__} (needs >=")


# --- the command line and the scripts ---------------------------------------------------


def run_script(script, *args, env=None):
    return subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=REPO)


def test_script_lines_json_and_exit_codes(project):
    good = run_script("training_preflight.py", project)
    assert good.returncode == 0, good.stdout + good.stderr
    lines = good.stdout.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == PROJECT_CHECKS
    assert all(line.startswith("WARN  " if line.split()[1] == "split" else "PASS  ") for line in lines[:-1])
    assert lines[-1] == "preflight passed with warnings: split"  # 24 posts: a rare tag
    image_of(project, 1).unlink()
    bad = run_script("training_preflight.py", project, "--format", "json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert report["ok"] is False and report["exit_code"] == 1
    assert {c["name"]: c["status"] for c in report["checks"]}["images"] == "FAIL"
    usage = run_script("training_preflight.py", project, "--max-image-checks", "-3")
    assert usage.returncode == 2 and "--max-image-checks: must be >= 0, got -3" in usage.stderr
    missing = run_script("training_preflight.py", project / "nope")
    assert missing.returncode == 2 and "project directory not found" in missing.stderr
    assert run_script("training_preflight.py").returncode == 2


def test_validate_script_exit_codes(project):
    assert run_script("validate_project_config.py", project, "--check-paths").returncode == 0
    edit_config(project, rotation_range=[10, 0])
    bad = run_script("validate_project_config.py", project)
    assert bad.returncode == 1
    assert f"FAIL  config  {project / 'project.json'}: rotation_range: low must be <= high, got [10, 0]" in bad.stdout
    assert "Traceback" not in bad.stderr
    assert run_script("validate_project_config.py", project, "--no-such-option").returncode == 2


def test_cli_preflight_uses_the_same_checks(project):
    runner = CliRunner()
    good = runner.invoke(main, ["preflight", str(project), "--max-image-checks", "3"])
    assert good.exit_code == 0, good.output
    assert "PASS  images      checked the first 3 of 24 eligible images" in good.output
    image_of(project, 2).write_bytes(b"")
    bad = runner.invoke(main, ["preflight", str(project), "--format", "json"])
    assert bad.exit_code == 1
    images = next(check for check in json.loads(bad.output)["checks"] if check["name"] == "images")
    assert images["detail"].endswith("empty file (0 bytes)")
    assert images["items"] == [f"id 2 {image_of(project, 2)}: empty file (0 bytes)"]
    assert runner.invoke(main, ["preflight", str(project / "nope")]).exit_code == 2
    assert runner.invoke(main, ["preflight", str(project), "--max-image-checks", "-1"]).exit_code == 2


# Installs an import blocker, then runs a script as __main__; reports what was blocked.
BLOCKED_RUN = textwrap.dedent("""
    import importlib.abc, json, runpy, sys
    BLOCKED = ("tensorflow", "keras", "numpy", "PIL")
    attempts = []
    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None
    sys.meta_path.insert(0, Blocker())
    script, *arguments = sys.argv[1:]
    sys.argv = [script, *arguments]
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = exit.code
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"code": code, "attempts": attempts, "loaded": loaded}), file=sys.stderr)
""")


def run_blocked(script, *args):
    # -S: no site-packages, so neither an installed deepdanbooru nor any third-party package is visible.
    done = subprocess.run([sys.executable, "-S", "-c", BLOCKED_RUN, str(SCRIPTS / script), *map(str, args)],
                          capture_output=True, text=True, cwd="/")
    outcome = json.loads(done.stderr.strip().splitlines()[-1])
    return outcome, done.stdout


def test_scripts_run_from_a_checkout_without_tensorflow_or_third_party_packages(project):
    outcome, out = run_blocked("training_preflight.py", project, "--max-image-checks", "0")
    assert outcome == {"code": 0, "attempts": [], "loaded": []}, out
    assert "PASS  images      checked all 24 eligible images: jpeg 24" in out
    outcome, out = run_blocked("validate_project_config.py", project, "--check-paths")
    assert outcome == {"code": 0, "attempts": [], "loaded": []}, out
    image_of(project, 7).write_bytes(b"\xff\xd8\xff")
    outcome, out = run_blocked("training_preflight.py", project)
    assert outcome["code"] == 1 and outcome["attempts"] == []
    assert "FAIL  images" in out


def test_probes_report_a_missing_tensorflow_instead_of_crashing(project, tmp_path):
    # sitecustomize runs in the script and in the children it starts, so TensorFlow is absent everywhere.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        import importlib.abc, sys
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("tensorflow", "keras"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, Blocker())
    """))
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{REPO}")
    done = run_script("training_preflight.py", project, "--probe-imports", "--probe-tensorflow", "--format", "json", env=env)
    assert done.returncode == 1, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["import tensorflow"]["status"] == "FAIL"
    assert checks["import tensorflow"]["detail"] == "cannot be imported: ModuleNotFoundError: No module named 'tensorflow'"
    assert checks["import keras"]["status"] == "FAIL"
    assert checks["import click"]["status"] == "PASS"
    assert checks["tensorflow"] == {"name": "tensorflow", "status": "FAIL",
                                    "detail": "TensorFlow cannot run: ModuleNotFoundError: No module named 'tensorflow'"}
    assert checks["images"]["status"] == "PASS"
    assert "Traceback" not in done.stderr


def test_preflight_command_does_not_import_tensorflow(sample_project):
    code = textwrap.dedent(f"""
        import sys
        from deepdanbooru.cli import main
        try:
            main(["preflight", {str(sample_project)!r}, "--check-packages"])
        except SystemExit as exit:
            assert exit.code == 0, exit.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "numpy", "PIL"))
        print(heavy)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def write_png_with_bad_data(path):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", 32, 32, 8, 2, 0, 0, 0)
    # Structurally whole (every CRC right), but the pixel data is not zlib: only a decoder can tell.
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"not zlib data")
                     + chunk(b"IEND", b""))


@pytest.mark.slow
def test_probe_tensorflow_decodes_the_sampled_images(project):
    broken = image_of(project, 6)
    write_png_with_bad_data(broken)
    results = training_preflight(project, max_image_checks=8, probe_tensorflow=True)
    assert statuses(results)["images"] == "WARN"  # a PNG under a .jpg name; its header is fine
    assert statuses(results)["tensorflow"] == "PASS"
    assert detail(results, "tensorflow").startswith("TensorFlow 2.")
    assert "computed on /physical_device:CPU:0" in detail(results, "tensorflow")
    assert "GPU works" not in detail(results, "tensorflow")
    assert only_failure(results, "tensorflow decode") == (
        f"1 of 8 sampled images do not decode: id 6 {broken}: Invalid PNG data, size {broken.stat().st_size}")


@pytest.mark.slow
def test_probe_tensorflow_decodes_webp_at_its_header_size(tmp_path):
    """decode_webp puts a frame axis first; the probe must read frame 0, as training does."""
    from PIL import Image

    from deepdanbooru.preflight.images import inspect_image
    from deepdanbooru.preflight.probes import probe_tensorflow

    still = tmp_path / "still.webp"
    Image.new("RGB", (40, 24), (200, 30, 30)).save(still)
    alpha = tmp_path / "alpha.webp"
    Image.new("RGBA", (30, 20), (200, 30, 30, 100)).save(alpha)
    animated = tmp_path / "animated.webp"
    frames = [Image.new("RGB", (18, 12), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(animated, save_all=True, append_images=frames[1:], duration=100)
    images = [(index, str(path), inspect_image(path)) for index, path in enumerate((still, alpha, animated), 1)]
    assert images[2][2].animated
    results = probe_tensorflow(images)
    assert statuses(results) == {"tensorflow": "PASS", "tensorflow decode": "PASS"}, results
    assert detail(results, "tensorflow decode") == "all 3 sampled images decode with tf.io at their header size"


@pytest.mark.slow
def test_probe_imports_reports_each_runtime_package(sample_project):
    results = training_preflight(sample_project, probe_imports=True)
    imports = {r.name: r for r in results if r.name.startswith("import ")}
    assert set(imports) == {"import tensorflow", "import keras", "import click", "import numpy", "import PIL"}
    assert all(r.status == "PASS" for r in imports.values()), imports
    import numpy
    assert imports["import numpy"].detail == f"version {numpy.__version__}"
    assert imports["import keras"].detail.endswith("backend tensorflow")


def test_check_packages_flags_missing_and_out_of_range_versions(sample_project, monkeypatch):
    from importlib import metadata

    from deepdanbooru.preflight import probes

    real = metadata.version

    def fake(distribution):
        if distribution == "keras":
            raise metadata.PackageNotFoundError(distribution)
        if distribution == "numpy":
            return "1.20.0"
        return real(distribution)

    monkeypatch.setattr(probes.metadata, "version", fake)
    results = {r.name: r for r in probes.check_packages()}
    assert results["package keras"].status == "FAIL"
    pins = probes.declared_requirements()
    assert results["package keras"].detail.startswith(f"not installed; deepdanbooru needs keras{pins['keras']} ")
    assert results["package numpy"].status == "FAIL"
    assert results["package numpy"].detail == f"numpy 1.20.0 is installed; deepdanbooru needs {pins['numpy']}"
    assert results["package click"].status == "PASS"
