"""README's two commands, parsed from README.md, so that this test breaks when README changes.

The first command is run as written on a temporary copy of sample-project, in
the current environment: its venv/pip steps are skipped, and each
`deepdanbooru ...` step runs as `python -m deepdanbooru ...` with the same
arguments from the same relative directory. Two changes keep it short: the
dataset gets fewer posts (`--count` is appended) and the copied project.json
trains one epoch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deepdanbooru.cli import make_sample_dataset as make_sample_dataset_command
from deepdanbooru.project.config import load_config
from deepdanbooru.project.tags import load_tags
from deepdanbooru.sample.generator import DATABASE_NAME, TAGS

# README's commands end to end, in subprocesses: the slow tier.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample-project"
# The files of sample-project that are in git; everything else in it is generated.
SAMPLE_FILES = ("project.json", "tags.txt", "README.md")
SETUP_STEPS = [
    ["python3", "-m", "venv", ".venv"],
    [".", ".venv/bin/activate"],
    ["pip", "install", "-e", "."],
]
TEST_COUNT = 48  # posts: enough for a validation split and a few steps


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## The two commands\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "README.md has no '## The two commands' section"
    return [line.strip() for line in match.group(1).splitlines() if line.startswith("    ") and line.strip()]


def steps(command: str) -> list[list[str]]:
    return [shlex.split(part) for part in command.split("&&")]


def deepdanbooru_steps(command: str) -> list[list[str]]:
    return [step[1:] for step in steps(command) if step[0] == "deepdanbooru"]


def test_readme_has_the_two_commands():
    first, second = readme_commands()
    setup = [step for step in steps(first) if step[0] != "deepdanbooru"]
    assert setup == SETUP_STEPS  # the only steps the end-to-end test below skips
    make_args, train_args = deepdanbooru_steps(first)
    assert make_args[0] == "make-sample-dataset" and train_args[0] == "train-project"
    test_steps = steps(second)
    assert test_steps[:2] == SETUP_STEPS[:2]
    assert test_steps[2] == ["pip", "install", "-e", ".[test]"]
    assert test_steps[3][:3] == ["python", "-m", "pytest"]


def test_sample_project_uses_what_make_sample_dataset_writes():
    make_args, train_args = deepdanbooru_steps(readme_commands()[0])
    dataset_dir = ROOT / make_args[1]
    project = ROOT / train_args[1]
    assert project == SAMPLE
    config = load_config(project)
    assert config.database_path.resolve() == (dataset_dir / DATABASE_NAME).resolve()
    assert not Path(json.loads((project / "project.json").read_text())["database_path"]).is_absolute()
    # The vocabulary is the generator's, in its order: the output layer's meaning.
    assert load_tags(project / "tags.txt") == list(TAGS)
    assert config.model == "resnet_small"
    assert config.validation_fraction > 0
    # Each post of the generator has at least 5 tags; a higher threshold would drop posts.
    assert config.minimum_tag_count <= 5
    defaults = {param.name: param.default for param in make_sample_dataset_command.params}
    assert defaults["image_format"] in config.image_extensions
    # Trained at the pictures' own size (docs/sample.md): no resampling loss.
    assert defaults["size"] == config.image_width == config.image_height


def test_training_outputs_of_the_sample_are_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    generated = ["dataset/dataset.sqlite", "dataset/images/ab/abc.jpg", "dataset/tags.txt", "checkpoints/ckpt-1.index",
                 "checkpoints/state.json", "logs/history.jsonl", "logs/bad_images.txt", "model-resnet_small.keras",
                 "model-resnet_small.e5.keras", "model-resnet_small.best.keras", "model-resnet_small.thresholds.csv",
                 "model-resnet_small.metrics.json", ".train.lock"]
    paths = [f"sample-project/{name}" for name in (*generated, *SAMPLE_FILES)]
    result = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    ignored = set(result.stdout.split())
    assert ignored == {f"sample-project/{name}" for name in generated}


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """Run the deepdanbooru steps of README's first command in a temporary directory: [(args, result)]."""
    work = tmp_path_factory.mktemp("readme")
    copy = work / SAMPLE.name
    copy.mkdir()
    for name in SAMPLE_FILES:
        shutil.copy2(SAMPLE / name, copy / name)
    config = json.loads((copy / "project.json").read_text())
    config["epoch_count"] = 1
    (copy / "project.json").write_text(json.dumps(config, indent=2))

    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    runs = []
    for args in deepdanbooru_steps(readme_commands()[0]):
        if args[0] == "make-sample-dataset":
            args = [*args, "--count", str(TEST_COUNT)]
        result = subprocess.run([sys.executable, "-m", "deepdanbooru", *args], cwd=work, env=environment,
                                capture_output=True, text=True)
        runs.append((args, result))
        if result.returncode:
            break
    return copy, runs


def test_readme_first_command_trains_the_sample(readme_run):
    project, runs = readme_run
    for args, result in runs:
        assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    assert [args[0] for args, _ in runs] == ["make-sample-dataset", "train-project"]
    made, trained = (result.stdout for _, result in runs)
    assert f"Wrote {TEST_COUNT} posts with {len(TAGS)} tags" in made
    assert (project / "dataset" / DATABASE_NAME).is_file()

    records = re.search(r"^Records: (\d+) training, (\d+) validation$", trained, re.M)
    assert records, trained
    training, validation = map(int, records.groups())
    assert training + validation == TEST_COUNT and validation > 0
    assert "Model: resnet_small, input" in trained
    assert "Training complete: 1 epoch(s)" in trained
    export = project / "model-resnet_small.keras"
    assert export.is_file() and f"Exported {export.relative_to(project.parent)}" in trained
    with zipfile.ZipFile(export) as archive:
        model_config = json.loads(archive.read("config.json"))
    assert model_config["class_name"] in ("Functional", "Model")
    assert list((project / "checkpoints").glob("ckpt-*.index"))


def test_readme_first_command_prints_the_validation_f1(readme_run):
    _, runs = readme_run
    output = runs[-1][1].stdout
    final = [line for line in output.splitlines() if line.startswith("Final validation")]
    assert len(final) == 1, output
    # README promises the validation F1 at the end of training.
    match = re.search(r"\bmicro-F1 (\d\.\d+)", final[0])
    assert match and 0.0 <= float(match.group(1)) <= 1.0, final[0]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_in_readme_and_docs_resolve():
    documents = [ROOT / "README.md", SAMPLE / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for document in documents:
        text = document.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            if not linked.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
                if anchor not in {_anchor(heading) for heading in headings}:
                    broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
