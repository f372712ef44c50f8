"""Training-step speed with and without XLA (jit_compile), per model family, and timm/PyTorch beside them.

    python bench/xla.py [--models resnet_small,convnext_tiny,efficientnetv2_b0,vit_small_patch16,wd_vit]
                        [--size 64] [--batch 16] [--steps 8] [--torch /path/to/python-with-torch-and-timm]
    python bench/xla.py --overhead     # the host's cost of one step call, plain and under XLA

Each measurement is a fresh subprocess, the three for one model one after the
other (Keras uncompiled, Keras under XLA, then timm if --torch names a Python
with torch and timm): the model-only bound of bench/train.py, i.e. the
project's TrainStep (Adam, binary cross-entropy, op determinism on, the
trainer's strategy) on one in-memory batch, samples/s over --steps steps
after 2 warm-up steps; the first step's seconds (trace and compile) too.

`wd_vit` is a WD-v3-style timm ViT (no class token, average pool, 12 blocks
of width 384, patch 8 at --size) made by timm with random weights into a
checkpoint folder and imported as import-model does; `wd_eva02` (the EVA02
layout of wd-eva02-large-tagger-v3 at that width and depth) and `wd_swinv2`
(wd-swinv2-tagger-v3's layout at swinv2_tiny's depths and widths, patch 2,
window 4) likewise; they need --torch. The
timm side trains the same architecture on the same batch size and cores
(torch.set_num_threads left at its default), AdamW, BCE with logits. Nothing
here is a dependency of the package: torch and timm come from the Python
given to --torch. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAGS = 200
WARMUP = 2

KERAS = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
name, size, batch, steps, jit, folder = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1", sys.argv[7]
import keras, numpy as np, tensorflow as tf
from deepdanbooru.models import build_model, make_optimizer
from deepdanbooru.models.pooling import use_strided_max_pooling
from deepdanbooru.training.step import TrainStep
from deepdanbooru.training.strategy import choose_strategy
keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
strategy = choose_strategy()
with strategy.scope():
    if folder:
        from deepdanbooru.models.timm.checkpoint import import_checkpoint
        model = import_checkpoint(folder).model
    else:
        model = build_model(name, (size, size, 3), TAGS, seed=0)
    optimizer = make_optimizer("adam", 0.0001)
    optimizer.build(model.trainable_variables)
if jit:
    use_strided_max_pooling(model)
tags = int(model.output_shape[-1])
rng = np.random.default_rng(0)
element = {"image": rng.random((batch, size, size, 3), dtype=np.float32),
           "label": (rng.random((batch, tags)) < 0.1).astype(np.float32), "position": np.arange(batch)}
dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(element).repeat().prefetch(2))
notices = []
step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False, jit_compile=jit,
                 echo=notices.append)
step.bind(dataset.element_spec)
iterator = iter(dataset)
begin = time.monotonic()
step(next(iterator)); step.sums.read_window()
first = time.monotonic() - begin
for _ in range(WARMUP - 1):
    step(next(iterator))
step.sums.read_window()
begin = time.monotonic()
for _ in range(steps):
    step(next(iterator))
step.sums.read_window()
seconds = time.monotonic() - begin
print(json.dumps({"samples_per_second": steps * batch / seconds, "first_step_seconds": first,
                  "compiled": step.jit_compile, "notices": notices}))
""".replace("TAGS", str(TAGS)).replace("WARMUP", str(WARMUP))

TORCH = r"""
import json, sys, time
import torch, timm
arch, args, size, batch, steps, folder = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
torch.manual_seed(0)
model = timm.create_model(arch, pretrained=False, num_classes=TAGS, **args)
if folder:  # write the checkpoint folder the Keras side imports (the WD layout)
    from pathlib import Path
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(Path(folder) / "model.safetensors"))
    config = {"architecture": arch, "num_classes": TAGS, "num_features": model.num_features,
              "global_pool": args.get("global_pool", "token"), "model_args": args,
              "pretrained_cfg": {"input_size": [3, size, size], "mean": [0.5] * 3, "std": [0.5] * 3,
                                 "interpolation": "bicubic", "crop_pct": 1.0, "num_classes": TAGS}}
    (Path(folder) / "config.json").write_text(json.dumps(config))
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = torch.nn.BCEWithLogitsLoss()
g = torch.Generator().manual_seed(0)
x = torch.rand((batch, 3, size, size), generator=g)
y = (torch.rand((batch, TAGS), generator=g) < 0.1).float()
def step():
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
begin = time.monotonic(); step(); first = time.monotonic() - begin
for _ in range(WARMUP - 1):
    step()
begin = time.monotonic()
for _ in range(steps):
    step()
print(json.dumps({"samples_per_second": steps * batch / (time.monotonic() - begin), "first_step_seconds": first}))
""".replace("TAGS", str(TAGS)).replace("WARMUP", str(WARMUP))


# The host's cost per step call: TrainStep on a model with next to no work (global pool and a 3x5 dense), so
# the time per call is the call itself, the iterator's next and the step's bookkeeping: what running several
# steps per call (as Keras' steps_per_execution) could save at most.
OVERHEAD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import keras, numpy as np, tensorflow as tf
from deepdanbooru.models import make_optimizer
from deepdanbooru.training.step import TrainStep
from deepdanbooru.training.strategy import choose_strategy
tf.config.experimental.enable_op_determinism()
strategy = choose_strategy()
result = {}
for jit in (False, True):
    with strategy.scope():
        image = keras.Input((8, 8, 3))
        model = keras.Model(image, keras.layers.Dense(5, activation="sigmoid")(keras.layers.GlobalAveragePooling2D()(image)))
        optimizer = make_optimizer("adam", 0.001)
        optimizer.build(model.trainable_variables)
    element = {"image": np.zeros((4, 8, 8, 3), np.float32), "label": np.zeros((4, 5), np.float32), "position": np.arange(4)}
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(element).repeat())
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False, jit_compile=jit)
    step.bind(dataset.element_spec)
    iterator = iter(dataset)
    for _ in range(5):
        step(next(iterator))
    step.sums.read_window()
    begin = time.monotonic()
    for _ in range(300):
        step(next(iterator))
    step.sums.read_window()
    result["xla" if jit else "plain"] = 1000 * (time.monotonic() - begin) / 300
print(json.dumps({"ms_per_call": result}))
"""


# Measured as import-model reads them: timm makes the checkpoint folder (random weights), Keras imports it.
IMPORTED = ("wd_vit", "wd_eva02", "wd_swinv2")


def _timm_twin(name: str, size: int) -> tuple[str, dict] | None:
    """The same architecture in timm, or None where timm has no twin (the DeepDanbooru ResNets)."""
    twins = {
        "convnext_tiny": ("convnext_tiny", {}),
        "convnext_small": ("convnext_small", {}),
        "efficientnetv2_b0": ("tf_efficientnetv2_b0", {}),
        "efficientnetv2_s": ("tf_efficientnetv2_s", {}),
        "vit_small_patch16": ("vit_small_patch16_224", {"img_size": size, "global_pool": "avg", "class_token": False,
                                                        "fc_norm": False}),
        # WD v3's ViT layout (no class token, average pool) at small-tagger width.
        "wd_vit": ("vit_small_patch16_224", {"img_size": size, "patch_size": 8, "global_pool": "avg",
                                             "class_token": False, "fc_norm": False, "act_layer": "gelu_tanh"}),
        # wd-eva02-large-tagger-v3's architecture (rotary embedding, SwiGLU, class token) at the same width.
        "wd_eva02": ("eva02_large_patch14_448", {"img_size": size, "patch_size": 8, "embed_dim": 384, "depth": 12,
                                                 "num_heads": 6, "global_pool": "avg",
                                                 "ref_feat_shape": [size // 8, size // 8]}),
        # wd-swinv2-tagger-v3's architecture at swinv2_tiny's depths and widths, windows that tile every stage.
        "wd_swinv2": ("swinv2_base_window8_256", {"img_size": size, "patch_size": 2, "window_size": 4, "embed_dim": 96,
                                                  "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24],
                                                  "global_pool": "avg"}),
    }
    return twins.get(name)


def _child(argv) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr).strip().splitlines()[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet_small,convnext_tiny,efficientnetv2_b0,vit_small_patch16,wd_vit")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--overhead", action="store_true", help="only the host's cost per step call")
    parser.add_argument("--torch", help="a Python with torch and timm (the timm side; wd_vit needs it)")
    args = parser.parse_args()
    if args.overhead:
        cost = _child([sys.executable, "-c", OVERHEAD, str(ROOT)])
        print(f"ms per step call: {cost}")
        print(json.dumps(cost))
        return
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            twin = _timm_twin(name, args.size)
            folder = ""
            row: dict = {}
            if name in IMPORTED:
                if not args.torch:
                    print(f"{name}: skipped (needs --torch to make its checkpoint)")
                    continue
                folder = str(Path(scratch) / name)
                Path(folder).mkdir()
            if args.torch and twin:
                row["timm"] = _child([args.torch, "-c", TORCH, twin[0], json.dumps(twin[1]), str(args.size),
                                      str(args.batch), str(args.steps), folder])
            for label, jit in (("keras", "0"), ("keras_xla", "1")):
                row[label] = _child([sys.executable, "-c", KERAS, str(ROOT), name, str(args.size), str(args.batch),
                                     str(args.steps), jit, folder])
            rate = {key: value.get("samples_per_second") for key, value in row.items()}
            if rate.get("keras") and rate.get("keras_xla"):
                row["xla_ratio"] = rate["keras_xla"] / rate["keras"]
            if rate.get("timm"):
                best = max(r for r in (rate.get("keras"), rate.get("keras_xla")) if r)
                row["best_keras_over_timm"] = best / rate["timm"]
            results[name] = row
            shown = "  ".join(f"{key} {value:.1f}/s" for key, value in rate.items() if value)
            ratios = "  ".join(f"{key} {row[key]:.2f}" for key in ("xla_ratio", "best_keras_over_timm") if key in row)
            errors = "  ".join(f"{key}: {value['error']}" for key, value in row.items()
                               if isinstance(value, dict) and "error" in value)
            print(f"{name}: {shown}  {ratios}  {errors}".rstrip(), flush=True)
    print(json.dumps({"size": args.size, "batch": args.batch, "steps": args.steps, "results": results}))


if __name__ == "__main__":
    main()
