"""docs/finetuning.md, run as written on the committed timm fixtures.

The page's only command that is not deepdanbooru's is the download; it is replaced by a copy of a WD-like
fixture (tests/fixtures/timm/vit_wd: 32x32 input, selected_tags.csv). The project.json values it shows are
applied with the size shrunk to the fixture's and a one-epoch, small-batch run.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "finetuning.md"
DOWNLOAD = "huggingface-cli download SmilingWolf/wd-vit-tagger-v3 --local-dir wd-vit-tagger-v3"
FIXTURE = ROOT / "tests" / "fixtures" / "timm" / "vit_wd"
FAST = {"epoch_count": 1, "minibatch_size": 4, "validation_fraction": 0.25}


def page_blocks() -> tuple[list[str], dict]:
    """(command lines, the project.json values) from the page's indented code blocks."""
    text = PAGE.read_text(encoding="utf-8")
    commands = [line[4:] for line in text.splitlines()
                if line.startswith("    ") and re.match(r"(deepdanbooru|huggingface-cli) ", line[4:])]
    values = json.loads(re.search(r"\n(    \{\n.*?\n    \})\n", text, re.S).group(1))
    return commands, values


def write_pictures(folder: Path) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir()
    tags = ["1girl", "solo", "red_hair", "smile"]
    for index in range(1, 17):
        Image.fromarray((rng.random((40, 40, 3)) * 255).astype(np.uint8)).save(folder / f"{index:04d}.png")
        chosen = [tag for tag in tags if rng.random() < 0.6] or ["solo"]
        (folder / f"{index:04d}.txt").write_text(", ".join(chosen))


@pytest.mark.slow
def test_every_command_of_the_page_runs(tmp_path, monkeypatch):
    commands, values = page_blocks()
    assert commands[0] == DOWNLOAD and not any(c.startswith("huggingface-cli") for c in commands[1:])
    assert [shlex.split(c)[1] for c in commands[1:]] == [
        "import-model", "evaluate", "create-project", "import-images", "make-tags", "train-project", "train-project",
        "export-bundle"]
    monkeypatch.chdir(tmp_path)
    shutil.copytree(FIXTURE, tmp_path / "wd-vit-tagger-v3")
    write_pictures(tmp_path / "my-pictures")
    size = json.loads((FIXTURE / "config.json").read_text())["pretrained_cfg"]["input_size"][1]
    outputs = {}
    untrained = tmp_path / "untrained"
    for command in commands[1:]:
        args = shlex.split(command)
        if args[1] == "make-tags":
            # The page's minimum is for a dataset of a thousand pictures; the 16 here keep tags at 1.
            assert args[args.index("--minimum-post-count") + 1] == "10"
            args[args.index("--minimum-post-count") + 1] = "1"
            config_path = tmp_path / "my-tagger" / "project.json"
            config = json.loads(config_path.read_text())
            config.update(values, **FAST, image_width=size, image_height=size)
            config_path.write_text(json.dumps(config))
        if args[1] == "train-project":
            # Each route of step 5 starts the project afresh.
            if untrained.exists():
                shutil.rmtree(tmp_path / "my-tagger")
                shutil.copytree(untrained, tmp_path / "my-tagger")
            else:
                shutil.copytree(tmp_path / "my-tagger", untrained)
        result = CliRunner().invoke(main, args[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        outputs[args[4] if args[1] == "train-project" else args[1]] = result.output
    assert "Channel order the weights expect: bgr" in outputs["import-model"]
    assert "Tags of my-pictures/0001.png" in outputs["evaluate"]
    for source in ("wd-vit-tagger-v3", "wd-vit-tagger-v3.keras"):
        assert re.search(rf"--source-model {re.escape(source)}: kept 2 tags, 2 new, 5 dropped \(listed in "
                         r"my-tagger/logs/vocabulary.txt\)", outputs[source])
        assert "Categories: my-tagger/categories.json written" in outputs[source]
    assert "channel order the weights expect: bgr" in outputs["wd-vit-tagger-v3"]
    report = (tmp_path / "my-tagger" / "logs" / "vocabulary.txt").read_text().splitlines()
    # WD's rating rows under the project's names for rating tags.
    assert sorted(report[1:5]) == ["kept\t1girl", "kept\tsolo", "new\tred_hair", "new\tsmile"]
    assert report[5:] == ["dropped\trating:general", "dropped\trating:sensitive", "dropped\trating:questionable",
                          "dropped\trating:explicit", "dropped\thatsune_miku"]
    assert (tmp_path / "my-bundle" / "model.onnx").is_file()
    rows = (tmp_path / "my-bundle" / "selected_tags.csv").read_text().splitlines()
    assert rows[0] == "tag_id,name,category,count,best_threshold,best_f1,use"
    # WD's four rating rows come first, as the tagger tools read them by position.
    assert [row.split(",")[1:3] for row in rows[1:5]] == [[name, "9"] for name in
                                                          ("general", "sensitive", "questionable", "explicit")]
