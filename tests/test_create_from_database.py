"""create-project --database: database_path, minimum_tag_count and image_extensions fitted to the posts."""

import json
import sqlite3

from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.dataset.build import POSTS_SCHEMA
from deepdanbooru.dataset.fit import fit_minimum_tag_count
from deepdanbooru.dataset.records import count_eligible
from deepdanbooru.project.config import load_config


def make_database(path, posts):
    """posts: (file_ext, tag_count_general) per post."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path)
    connection.execute(POSTS_SCHEMA)
    connection.executemany("INSERT INTO posts (id, md5, file_ext, tag_string, tag_count_general) VALUES (?, ?, ?, ?, ?)",
                           [(i + 1, f"{i:032x}", ext, "a", count) for i, (ext, count) in enumerate(posts)])
    connection.commit()
    connection.close()
    return path


def test_fit_minimum_tag_count():
    assert fit_minimum_tag_count([25] * 6 + [3] * 4, 20) == 20  # the default keeps most posts
    assert fit_minimum_tag_count([8] * 9 + [1], 20) == 8  # own captions: what 90% of them reach
    assert fit_minimum_tag_count([0] * 10, 20) == 1
    assert fit_minimum_tag_count([], 20) == 20


def test_create_project_from_an_imported_database(tmp_path):
    database = make_database(tmp_path / "data" / "dataset.sqlite",
                             [("webp", 6)] * 5 + [("png", 9)] * 4 + [("gif", 2)] + [("mp4", 30)])
    project = tmp_path / "work" / "project"
    result = CliRunner().invoke(main, ["create-project", str(project), "--database", str(database)])
    assert result.exit_code == 0, result.output
    data = json.loads((project / "project.json").read_text())
    assert data["database_path"] == "../../data/dataset.sqlite"
    assert data["image_extensions"] == ["png", "jpg", "jpeg", "gif", "webp"]
    assert data["minimum_tag_count"] == 6  # 9 of the 10 image posts reach 6 (the mp4 post does not count)
    lines = result.output.splitlines()
    assert "database_path: ../../data/dataset.sqlite (relative to the project folder)" in lines
    assert "minimum_tag_count: 6: 9 of 10 posts have at least 6 general tags (the default 20 would keep 0)" in lines
    assert "image_extensions: png, jpg, jpeg, gif, webp (the database holds 1 gif, 5 webp)" in lines
    assert "note: 1 mp4 posts are in no format deepdanbooru trains on and stay unused" in lines
    assert "set database_path" not in result.output
    config = load_config(project)
    connection = sqlite3.connect(config.require_database())
    assert count_eligible(connection, config.minimum_tag_count, config.image_extensions) == 9
    connection.close()


def test_create_project_refuses_a_database_without_posts(tmp_path):
    database = tmp_path / "empty.sqlite"
    sqlite3.connect(database).close()
    result = CliRunner().invoke(main, ["create-project", str(tmp_path / "p"), "--database", str(database)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {database}: posts: table not found\n"
    assert not (tmp_path / "p").exists()
