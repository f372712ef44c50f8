"""import-model: timm checkpoints (ViT, EVA02, ConvNeXt, SwinV2; WD v3 taggers) against timm's own outputs.

The fixtures under tests/fixtures/timm were made by make_fixtures.py there with timm and torch; these tests
need neither.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.errors import ModelError

FIXTURES = Path(__file__).parent / "fixtures" / "timm"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
TOLERANCE = 1e-4


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def timm_scores(folder: Path) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.load(folder / "logits.npy").astype(np.float64)))


def test_the_fixtures_cover_every_option_set():
    configs = {name: json.loads((FIXTURES / name / "config.json").read_text()) for name in NAMES}
    args = [c["model_args"] for c in configs.values()]
    assert {a.get("global_pool", "token") for a in args if "embed_dim" in a} == {"token", "avg", "map"}
    assert {a.get("act_layer", "gelu") for a in args} == {"gelu", "gelu_tanh"}
    assert any(a.get("class_token") is False for a in args) and any(a.get("reg_tokens") for a in args)
    assert any(a.get("no_embed_class") for a in args) and any(a.get("init_values") for a in args)
    assert any(a.get("qkv_bias") is False for a in args) and any(a.get("head_norm_first") for a in args)
    assert {a.get("fc_norm") for a in args if "embed_dim" in a} == {None, False, True}
    dtypes = set()
    for name in NAMES:
        from deepdanbooru.models.timm.safetensors import read_header

        dtypes |= {info.dtype for info in read_header(FIXTURES / name / "model.safetensors")[0].values()}
    assert dtypes == {"F32", "F16", "BF16"}


@pytest.mark.parametrize("name", NAMES)
def test_imported_model_matches_timm(name):
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    folder = FIXTURES / name
    imported = import_checkpoint(folder)
    inputs = np.load(folder / "inputs.npy")
    assert tuple(imported.model.input_shape[1:]) == (*imported.input_size, 3) == inputs.shape[1:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        called = imported.model(inputs)
    # One input and one output, not one-element lists: Keras warned on every call of a model built on lists.
    assert not isinstance(called, (list, tuple))
    assert not [w for w in caught if "structure" in str(w.message)]
    scores = np.asarray(called, dtype=np.float64)
    assert np.abs(scores - timm_scores(folder)).max() < TOLERANCE
    tagger = (folder / "selected_tags.csv").is_file()
    assert imported.channel_order == ("bgr" if tagger else "rgb")
    config = json.loads((folder / "config.json").read_text())
    names = config.get("label_names") or [tag for tag in imported.tags if tagger] or \
        [f"class_{index}" for index in range(7)]
    assert list(imported.tags) == names


def test_channel_order_is_folded_in_and_matters():
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    folder = FIXTURES / "convnext_wd"
    inputs = np.load(folder / "inputs.npy")
    flipped = np.asarray(import_checkpoint(folder, "rgb").model(inputs[..., ::-1]))
    # rgb on BGR-flipped images is the same model as bgr on the images.
    assert np.abs(flipped - timm_scores(folder)).max() < TOLERANCE
    wrong = np.asarray(import_checkpoint(folder, "rgb").model(inputs))
    assert np.abs(wrong - timm_scores(folder)).max() > 1e-3


def test_safetensors_reader_widens_half_precision(tmp_path):
    from deepdanbooru.models.timm.safetensors import read_tensors

    values = np.array([1.5, -2.25, 65504.0, 2.0**-14], dtype=np.float32)
    half = values.astype("<f2").tobytes()
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"h": ("F16", (2, 2), half), "b": ("BF16", (4,), bf16)})
    tensors = read_tensors(path)
    np.testing.assert_array_equal(tensors["h"], values.reshape(2, 2))
    # bfloat16 is float32's top 16 bits.
    np.testing.assert_array_equal(tensors["b"], (values.view(np.uint32) & 0xFFFF0000).view(np.float32))
    assert tensors["b"][2] == 65280.0
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ModelError, match=r"x.safetensors: (h|b): data_offsets .* do not fit shape"):
        read_tensors(path)


def write_safetensors(path, tensors: dict) -> None:
    header, data = {}, b""
    for name, (dtype, shape, content) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(content)]}
        data += content
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


_PLAIN = textwrap.dedent(
    """
    import sys
    import keras, numpy as np
    for model_path, inputs, outputs in zip(*[iter(sys.argv[1:])] * 3):
        model = keras.models.load_model(model_path, compile=False)
        np.save(outputs, keras.ops.convert_to_numpy(model(np.load(inputs))))
    assert "deepdanbooru" not in sys.modules
    """
)


@pytest.mark.slow
def test_import_model_writes_a_plain_keras_model_with_its_tags(tmp_path):
    arguments = []
    for name in ("vit_wd", "swinv2_wd", "convnext_wd", "eva02_wd"):
        # --save-path in a folder that does not exist yet: the folder is made.
        target = (tmp_path / "new" / "folder" if name == "convnext_wd" else tmp_path) / f"{name}.keras"
        result = run_cli("import-model", FIXTURES / name, "--output", target)
        assert result.exit_code == 0, result.output
        assert "Channel order the weights expect: bgr: selected_tags.csv marks a WD tagger" in result.output
        arguments += [str(target), str(FIXTURES / name / "inputs.npy"), str(tmp_path / f"{name}.npy")]
    wd_tags = ["general", "sensitive", "questionable", "explicit", "1girl", "solo", "hatsune_miku"]
    assert (tmp_path / "vit_wd.tags.txt").read_text().split() == wd_tags
    from deepdanbooru.models.vocabulary import read_model_tags

    # The model carries its tags too: a renamed copy without the .tags.txt still knows them.
    assert read_model_tags(tmp_path / "vit_wd.keras") == tuple(wd_tags)
    from deepdanbooru.project.categories import parse_categories

    categories = parse_categories((tmp_path / "vit_wd.categories.json").read_text(), "x", 7)
    assert categories == [9, 9, 9, 9, 0, 0, 4]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, "-c", _PLAIN, *arguments], check=True, capture_output=True, env=env,
                   cwd=tmp_path)
    for name in ("vit_wd", "swinv2_wd", "convnext_wd", "eva02_wd"):
        assert np.abs(np.load(tmp_path / f"{name}.npy") - timm_scores(FIXTURES / name)).max() < TOLERANCE
    again = run_cli("import-model", FIXTURES / "vit_wd", "--save-path", tmp_path / "vit_wd.keras")
    assert again.exit_code == 2 and "vit_wd.keras: already exists; use --overwrite" in again.output
    under_a_file = run_cli("import-model", FIXTURES / "vit_wd", "--save-path", tmp_path / "vit_wd.tags.txt" / "m.keras")
    assert under_a_file.exit_code == 2
    assert under_a_file.output == f"error: {tmp_path / 'vit_wd.tags.txt'}: is not a folder; give a path inside a folder\n"


def _copy(name, tmp_path) -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def _edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _rewrite_tensors(folder, change):
    from deepdanbooru.models.timm.safetensors import read_tensors

    tensors = change(read_tensors(folder / "model.safetensors"))
    write_safetensors(folder / "model.safetensors",
                      {k: ("F32", v.shape, np.ascontiguousarray(v, "<f4").tobytes()) for k, v in tensors.items()})


def _drop(name):
    return lambda tensors: {k: v for k, v in tensors.items() if k != name}


BAD = {
    "unknown architecture": (lambda f: _edit_config(f, lambda c: c.update(architecture="resnet50")),
                             r"config.json: architecture: 'resnet50' is not supported; "
                             r"supported: vit_\{.*convnext_\{.*swinv2_\{"),
    "architecture not text": (lambda f: _edit_config(f, lambda c: c.update(architecture=5)),
                              r"config.json: architecture: 5 is not text \(the timm model name"),
    "no architecture": (lambda f: _edit_config(f, lambda c: c.pop("architecture")),
                        r"config.json: architecture: missing \(the timm model name"),
    "no model_args": (lambda f: _edit_config(f, lambda c: c.pop("model_args")),
                      r"config.json: model_args: missing: timm builds the model from architecture and model_args"),
    "unknown model_args": (lambda f: _edit_config(f, lambda c: c["model_args"].update(qk_norm=True)),
                           r"config.json: model_args.qk_norm: is not supported for vit_base_patch16_224"),
    "missing tensor": (lambda f: _rewrite_tensors(f, _drop("blocks.1.attn.proj.bias")),
                       r"model.safetensors: missing 1 tensor\(s\) the architecture needs: blocks.1.attn.proj.bias$"),
    "extra tensor": (lambda f: _rewrite_tensors(f, lambda t: {**t, "cls_token": np.zeros((1, 1, 32))}),
                     r"model.safetensors: 1 tensor\(s\) the architecture does not have .*: cls_token$"),
    "shape mismatch": (lambda f: _edit_config(f, lambda c: c["model_args"].update(img_size=48)),
                       r"model.safetensors: pos_embed: has shape \[1, 16, 32\], the architecture needs \[1, 36, 32\]"),
    "tags do not match the head": (
        lambda f: (f / "selected_tags.csv").write_text((f / "selected_tags.csv").read_text() + "9,extra,0,1\n"),
        r"selected_tags.csv: has 8 tag rows but the head has 7 outputs"),
    "bad tag row": (lambda f: (f / "selected_tags.csv").write_text("tag_id,name,category,count\n1,a,7,1\n"),
                    r"selected_tags.csv: line 2: unknown category 7"),
    "weights a folder": (lambda f: ((f / "model.safetensors").unlink(), (f / "model.safetensors").mkdir()),
                         r"model.safetensors: is a folder, not a file \(a timm checkpoint folder holds"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_checkpoint_gets_one_line_and_nothing_written(case, tmp_path):
    spoil, message = BAD[case]
    folder = _copy("vit_wd", tmp_path)
    spoil(folder)
    out = tmp_path / "out"
    out.mkdir()
    # The destination's folder is missing: a refused import must not make it.
    result = run_cli("import-model", folder, "--save-path", out / "missing" / "m.keras")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    import re

    assert re.search(message, lines[0]), lines[0]
    assert list(out.iterdir()) == []


# --- backbone_weights: a timm folder's trunk in a registry model ---

def _synthetic_checkpoint(folder: Path, architecture, model_args, family, size, dtype="F32"):
    """A checkpoint folder with random weights of every tensor the importer expects (norms away from 1)."""
    folder.mkdir()
    config = {"architecture": architecture, "num_classes": 3, "model_args": model_args,
              "pretrained_cfg": {"input_size": [3, *size], "mean": [0.485, 0.456, 0.406],
                                 "std": [0.229, 0.224, 0.225]}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "selected_tags.csv").write_text("tag_id,name,category,count\n1,general,9,1\n2,solo,0,1\n3,miku,4,1\n")
    opts = family.options(architecture, model_args, 3, folder / "config.json")
    rng = np.random.default_rng(0)
    stored = {"F32": "<f4", "F16": "<f2"}[dtype]
    tensors = {}
    for name, shape in family.expected_tensors(opts).items():
        values = 0.1 * rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 1 and name.endswith(".weight"):  # the norms' scales
            values += 1.0
        tensors[name] = (dtype, shape, values.astype(stored).tobytes())
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _features(model, layer_name, x, use_input=False):
    import keras

    layer = model.get_layer(layer_name)
    return np.asarray(keras.Model(model.input, layer.input if use_input else layer.output)(x))


def test_backbone_weights_takes_a_timm_vit_folder(tmp_path, monkeypatch):
    from deepdanbooru.models.timm import vit
    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru import registry
    from deepdanbooru.models.backbone import load_backbone_weights
    from deepdanbooru.models.builder import build_model

    # A registry row the size of the checkpoint, so the test stays small.
    monkeypatch.setitem(registry.MODELS, "vit_test", registry.Architecture((32,), (2,), "pooled", "vit", patch=8,
                                                                          heads=4))
    folder = _synthetic_checkpoint(tmp_path / "vit", "vit_base_patch16_224", {
        "embed_dim": 32, "depth": 2, "num_heads": 4, "patch_size": 8, "img_size": 32, "class_token": False,
        "global_pool": "avg", "fc_norm": False}, vit, (32, 32))
    imported = import_checkpoint(folder).model
    registry = build_model("vit_test", (32, 32, 3), 5, seed=1)
    assert load_backbone_weights(registry, "vit_test", folder, (32, 32, 3)) == 2 * 5 + 3
    x = np.random.default_rng(1).random((2, 32, 32, 3), dtype=np.float32)
    # The same features from the registry's own preprocessing (x * 2 - 1) and the checkpoint's ImageNet mean and
    # std, BGR: both folds are right.
    np.testing.assert_allclose(_features(registry, "vit_norm", x), _features(imported, "vit_norm", x), atol=1e-5)
    # Another input size: the position table is resampled to the project's grid.
    bigger = build_model("vit_test", (48, 48, 3), 5)
    load_backbone_weights(bigger, "vit_test", folder, (48, 48, 3))
    assert np.isfinite(np.asarray(bigger(np.zeros((1, 48, 48, 3), np.float32)))).all()


@pytest.mark.slow
def test_backbone_weights_takes_a_timm_convnext_folder(tmp_path):
    from deepdanbooru.models.timm import convnext
    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru.models.backbone import load_backbone_weights
    from deepdanbooru.models.builder import build_model

    # convnext_tiny's real size (the registry row is keras.applications'), stored as float16 to halve the file.
    folder = _synthetic_checkpoint(tmp_path / "convnext", "convnext_tiny", {}, convnext, (32, 32), "F16")
    imported = import_checkpoint(folder).model
    registry = build_model("convnext_tiny", (32, 32, 3), 5, seed=1)
    assert load_backbone_weights(registry, "convnext_tiny", folder, (32, 32, 3)) == 1 + 1 + 3 * 2 + 18 * 5 + 1
    x = np.random.default_rng(1).random((2, 32, 32, 3), dtype=np.float32)
    ours = _features(registry, "convnext_tiny_layer_normalization_0", x, use_input=True)
    np.testing.assert_allclose(ours, _features(imported, "convnext_tiny_stage_3_block_2_add", x), atol=1e-4)


def test_backbone_weights_folder_of_another_family_or_size_is_refused(tmp_path):
    from deepdanbooru.models.backbone import load_backbone_weights
    from deepdanbooru.models.builder import build_model

    model = build_model("vit_small_patch16", (32, 32, 3), 5)
    with pytest.raises(ModelError, match=r"convnext/config.json: architecture: a convnext_tiny checkpoint cannot "
                                         r"start vit_small_patch16 \(a vit model\)"):
        load_backbone_weights(model, "vit_small_patch16", FIXTURES / "convnext", (32, 32, 3))
    with pytest.raises(ModelError, match=r"vit_token/config.json: vit_base_patch16_224's \(embed_dim, depth, "
                                         r"num_heads, patch_size, mlp width\) is \(32, 2, 4, 8, 128\); "
                                         r"vit_small_patch16's trunk needs \(384, 12, 6, 16, 1536\)"):
        load_backbone_weights(model, "vit_small_patch16", FIXTURES / "vit_token", (32, 32, 3))


def test_backbone_weights_folder_must_be_a_checkpoint(tmp_path):
    from deepdanbooru.errors import ConfigError
    from deepdanbooru.project.config import load_config

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "project.json").write_text(json.dumps({"backbone_weights": "ckpt"}))
    config = load_config(tmp_path)
    with pytest.raises(ConfigError, match=r"project.json: backbone_weights: folder .*ckpt has no config.json"):
        config.require_backbone_weights()
    shutil.copy(FIXTURES / "vit_token" / "config.json", tmp_path / "ckpt")
    assert config.require_backbone_weights() == tmp_path / "ckpt"


@pytest.mark.slow
def test_evaluate_model_path_reads_the_categories_import_model_wrote(tmp_path):
    from PIL import Image

    models = tmp_path / "models"
    assert run_cli("import-model", FIXTURES / "vit_wd", "--save-path", models / "wd.keras").exit_code == 0
    picture = tmp_path / "picture.png"
    Image.fromarray((np.random.default_rng(3).random((32, 32, 3)) * 255).astype(np.uint8)).save(picture)

    def reported(*options):
        result = run_cli("evaluate", picture, "--model-path", models / "wd.keras", "--threshold", "0",
                         "--format", "json", *options)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["tags"], result.stderr

    everything, _ = reported()
    assert list(everything) == ["general", "sensitive", "questionable", "explicit", "1girl", "solo", "hatsune_miku"]
    # wd.categories.json: the four ratings, 1girl and solo general, hatsune_miku a character.
    tags, stderr = reported("--character-threshold", "1")
    assert list(tags) == ["general", "sensitive", "questionable", "explicit", "1girl", "solo"]
    assert "thresholds: 0 for every tag (--threshold); character tags: 1" in stderr
    middle = (everything["1girl"] + everything["solo"]) / 2
    tags, _ = reported("--general-threshold", str(middle), "--character-threshold", "0")
    kept = max(("1girl", "solo"), key=everything.get)
    assert list(tags) == ["general", "sensitive", "questionable", "explicit", kept, "hatsune_miku"]
    # A renamed copy has neither its tags nor its categories beside it: the tags inside it still apply, and the
    # missing categories file is named.
    (models / "wd.keras").rename(tmp_path / "copy.keras")
    result = run_cli("evaluate", picture, "--model-path", tmp_path / "copy.keras", "--character-threshold", "0.5")
    assert result.exit_code == 2
    assert result.stderr == (f"error: --character-threshold: no tag of the model is known as a character tag: "
                             f"{tmp_path / 'copy.categories.json'} is missing (import-model writes it beside the "
                             "model it imports; a project's categories.json beside the model serves too)\n")
