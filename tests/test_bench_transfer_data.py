"""bench/transfer_data.py on tiny stand-ins for the npm packages: disjoint parts, tags held back."""

import hashlib
import io
import json
import sqlite3
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from bench_modules import load_bench

KEYWORDS = ["face", "smile", "animal", "cat", "food", "hand", "heart", "star"]


@pytest.fixture(scope="module")
def transfer():
    return load_bench("transfer_data")


def _tgz(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _packages(folder: Path, count: int = 40) -> None:
    folder.mkdir()
    codes = [f"1F{600 + i:03X}" for i in range(count)]
    data = [{"hexcode": code, "label": f"e{i}", "group": i % 2, "subgroup": i % 3,
             "tags": [KEYWORDS[i % 8], KEYWORDS[(i * 3 + 1) % 8], "Two Words"]} for i, code in enumerate(codes)]
    groups = {"groups": {"0": "smileys-emotion", "1": "people-body"},
              "subgroups": {"0": "face-smiling", "1": "hand-fingers", "2": "heart"}}
    _tgz(folder / "emojibase-data-17.0.0.tgz", {"package/en/data.json": json.dumps(data).encode(),
                                                 "package/meta/groups.json": json.dumps(groups).encode()})
    for shade, artist in enumerate(("apple", "google", "facebook", "twitter")):
        # Variation selector 16 written by one package and not the other must still match.
        table = [{"unified": code + ("-FE0F" if i == 0 else ""), "image": f"{code.lower()}.png",
                  f"has_img_{artist}": True} for i, code in enumerate(codes)]
        files = {"package/emoji.json": json.dumps(table).encode()}
        for i, code in enumerate(codes):
            buffer = io.BytesIO()
            drawing = Image.new("RGBA", (64, 64), (i * 6, shade * 60, 100, 255))
            drawing.putpixel((0, 0), (0, 0, 0, 0))  # transparent background
            drawing.save(buffer, "PNG")
            files[f"package/img/{artist}/64/{code.lower()}.png"] = buffer.getvalue()
        _tgz(folder / f"emoji-datasource-{artist}-16.0.0.tgz", files)


def _posts(database: Path) -> list[tuple]:
    connection = sqlite3.connect(database)
    try:
        return connection.execute("SELECT md5, file_ext, tag_string, tag_count_general FROM posts").fetchall()
    finally:
        connection.close()


def test_parts_share_no_emoji_and_pretraining_never_sees_a_held_back_tag(transfer, tmp_path):
    _packages(tmp_path / "packages")
    out = tmp_path / "out"
    report = transfer.build(tmp_path / "packages", out, size=32, seed=0, pretrain_fraction=0.5, held_back=0.3,
                            min_emoji=3)
    held = (out / "held_back.txt").read_text().split()
    assert held and held == report["held_back"]
    assert report["emoji"] == {"pretrain": 20, "finetune": 20}
    pretrain, finetune = _posts(out / "pretrain" / "dataset.sqlite"), _posts(out / "finetune" / "dataset.sqlite")
    assert len(pretrain) == len(finetune) == 80  # four artists' drawings of 20 emoji each
    assert not {p[0] for p in pretrain} & {p[0] for p in finetune}
    pretrain_tags = {tag for post in pretrain for tag in post[2].split()}
    finetune_tags = {tag for post in finetune for tag in post[2].split()}
    assert not pretrain_tags & set(held) and set(held) <= finetune_tags
    assert {"two_words", "smileys_emotion", "face_smiling"} <= pretrain_tags | finetune_tags
    for md5, ext, tag_string, count in finetune:
        image = out / "finetune" / "images" / md5[:2] / f"{md5}.{ext}"
        assert hashlib.md5(image.read_bytes()).hexdigest() == md5 and count == len(tag_string.split())
        with Image.open(image) as picture:
            assert picture.mode == "RGB" and picture.size == (32, 32)
    with Image.open(image.with_suffix(".png")) as picture:  # drawn at 64 px, scaled to 32, on white
        assert picture.getpixel((31, 31)) != (255, 255, 255) and min(picture.getpixel((0, 0))) > 100
    assert (out / "finetune" / "tags.txt").read_text().split() == sorted(
        finetune_tags, key=lambda tag: (-sum(tag in p[2].split() for p in finetune), tag))


def test_a_missing_package_is_one_line_naming_it(transfer, tmp_path, capsys):
    _packages(tmp_path / "packages")
    (tmp_path / "packages" / "emoji-datasource-google-16.0.0.tgz").unlink()
    assert transfer.main([str(tmp_path / "packages"), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path / 'packages'}: no emoji-datasource-google-<version>"
                                               ".tgz (npm pack emoji-datasource-google)")
    assert not (tmp_path / "out").exists()
