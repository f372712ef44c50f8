import json
import sqlite3
from collections import Counter

from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.dataset.build import rank_tags
from deepdanbooru.project.tags import count_tags
from deepdanbooru.project.tags import load_tags


def make_project(tmp_path, rows, minimum_tag_count=0, extra=None):
    tmp_path.mkdir(exist_ok=True)
    database = tmp_path / "data" / "posts.sqlite"
    database.parent.mkdir()
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER)")
    connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?)", rows)
    connection.commit()
    connection.close()
    project = tmp_path / "project"
    project.mkdir()
    config = {"database_path": "../data/posts.sqlite", "minimum_tag_count": minimum_tag_count, **(extra or {})}
    (project / "project.json").write_text(json.dumps(config))
    return project


ROWS = [
    (1, "a1", "jpg", "cat dog rating:explicit", 2),
    (2, "a2", "png", "cat bird rating:general", 2),
    (3, "a3", "jpg", "cat dog dog rating:general", 2),  # dog twice in one post counts once
    (4, "a4", "gif", "cat fish", 2),  # gif: not eligible by default
    (5, "a5", "jpg", "bird ant", 1),
    (6, "a6", "jpeg", "zebra", 0),
]


def invoke(*args):
    return CliRunner().invoke(main, ["make-tags", *map(str, args)])


def test_tags_by_frequency_ties_by_name_rating_last(tmp_path):
    project = make_project(tmp_path, ROWS)
    result = invoke(project)
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == [
        "cat", "bird", "dog", "ant", "zebra", "rating:general", "rating:explicit"]
    assert "Wrote 7 tags (2 rating system tags)" in result.output
    assert "from 5 eligible of 6 posts" in result.output
    assert "most frequent: cat (3), bird (2), dog (2)" in result.output


def test_min_count_limit_and_no_system_tags(tmp_path):
    project = make_project(tmp_path, ROWS)
    result = invoke(project, "--minimum-post-count", 2, "--limit", 2)
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == ["cat", "bird", "rating:general"]
    out = tmp_path / "other.txt"
    result = invoke(project, "--no-system-tags", "--save-path", out)
    assert result.exit_code == 0, result.output
    assert out.read_text() == "cat\nbird\ndog\nant\nzebra\n"


def test_uses_project_eligibility(tmp_path):
    project = make_project(tmp_path, ROWS, minimum_tag_count=2, extra={"image_extensions": ["jpg", "png", "gif"]})
    result = invoke(project, "--no-system-tags")
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == ["cat", "dog", "bird", "fish"]


def test_refuses_to_overwrite(tmp_path):
    project = make_project(tmp_path, ROWS)
    (project / "tags.txt").write_text("old\n")
    result = invoke(project)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {project / 'tags.txt'}: already exists; use --overwrite to replace it"
    assert (project / "tags.txt").read_text() == "old\n"
    assert invoke(project, "--overwrite").exit_code == 0
    assert (project / "tags.txt").read_text().startswith("cat\n")


def test_no_tag_reaches_min_count(tmp_path):
    project = make_project(tmp_path, ROWS)
    result = invoke(project, "--minimum-post-count", 4)
    assert result.exit_code == 2
    assert "no tag occurs in 4 or more of the 5 eligible posts" in result.output
    assert not (project / "tags.txt").exists()


def test_no_eligible_posts_names_minimum_tag_count(tmp_path):
    project = make_project(tmp_path, ROWS, minimum_tag_count=50)
    result = invoke(project)
    assert result.exit_code == 2
    assert "no eligible posts" in result.output and "tag_count_general >= 50" in result.output
    assert not (project / "tags.txt").exists()


def test_bad_project_inputs(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({"database_path": None}))
    result = invoke(project)
    assert result.exit_code == 2 and "database_path: is null" in result.output

    (project / "project.json").write_text(json.dumps({"database_path": "nope.sqlite"}))
    result = invoke(project)
    assert result.exit_code == 2 and "database_path: file not found" in result.output

    make_project(tmp_path / "other", ROWS)
    (project / "project.json").write_text(json.dumps({"database_path": str(tmp_path / "other/data/posts.sqlite")}))
    result = invoke(project, "--save-path", tmp_path / "missing" / "tags.txt")
    assert result.exit_code == 2
    assert f"{tmp_path / 'missing' / 'tags.txt'}: directory {tmp_path / 'missing'} does not exist" in result.output

    result = invoke(project, "--minimum-post-count", 0)
    assert result.exit_code == 2 and "--minimum-post-count" in result.output
    assert not (project / "tags.txt").exists()


def test_keys_make_tags_does_not_use_only_warn(tmp_path):
    project = make_project(tmp_path, ROWS, extra={"model": "resnet_bogus", "minibatch_size": 0})
    result = invoke(project)
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt")[0] == "cat"
    assert "warning: " in result.output and "model: must be one of" in result.output


def test_rank_tags_directly():
    counts = count_tags(["b a", "a c rating:questionable rating:sensitive", "a b", "rating:safe x"])
    assert counts == Counter({"a": 3, "b": 2, "c": 1, "x": 1, "rating:questionable": 1, "rating:sensitive": 1,
                              "rating:safe": 1})
    # Known rating tags in DeepDanbooru order, unknown rating:* after them.
    assert rank_tags(counts) == ["a", "b", "c", "x", "rating:sensitive", "rating:questionable", "rating:safe"]
    assert rank_tags(counts, limit=1, system_tags=False) == ["a"]
