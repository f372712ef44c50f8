"""Pretrain a small WD-v3-style timm ViT on a Danbooru-style dataset, on the CPU, for a wall-clock budget.

    # needs torch, timm and safetensors (not deepdanbooru's dependencies): a venv of its own
    python bench/transfer_pretrain.py transfer-data/pretrain vit-emoji [--minutes 20] [--seed 0]
    python bench/transfer_pretrain.py transfer-data/pretrain convnext-emoji --architecture convnext_atto
    deepdanbooru import-model vit-emoji --save-path vit-emoji.keras

The model is what SmilingWolf's WD v3 ViT taggers are, shrunk to CPU size: timm's VisionTransformer
with no class token, average pooling, no fc_norm and tanh-approximated GELU, fed BGR pictures scaled
to [-1, 1] (mean and std 0.5), one sigmoid output per tag. It trains with AdamW, BCE, a linear
warm-up and a cosine decay laid over the time budget (not over epochs, so a loaded machine trains
fewer steps but still ends at the low rate), on random shifts of up to 1/8 of the side.

--architecture convnext_NAME trains timm's ConvNeXt of that size instead (what wd-convnext-tagger-v3 is,
at its own widths; timm's defaults otherwise), with the same input, loss, optimizer and schedule; the
ViT's shape options (--patch, --width, --depth, --heads) do not apply to it.

Written to OUT in the Hugging Face timm layout that WD v3 taggers use: config.json (architecture,
model_args, pretrained_cfg), model.safetensors and selected_tags.csv (tag_id, name, category, count;
every tag general). OUT/pretrain.json holds the run's figures: steps, epochs, seconds, and mAP on the
posts held out (--holdout) from training. The posts are held out by tag_string: the four drawings of one
emoji carry the same tags, so holding out single posts would score the model on emoji it trained on in
another artist's drawing (runs before this rule reported 0.627 on such a holdout for a ConvNeXt whose
start scored 0.254 on the fine-tuning part's unseen emoji).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sqlite3
import sys
import time
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

ARCHITECTURE = "vit_tiny_patch16_224"  # what the name says is overridden by model_args, as WD v3's are
WD_STYLE = {"class_token": False, "global_pool": "avg", "fc_norm": False, "act_layer": "gelu_tanh"}


def load(dataset: Path, size: int) -> tuple[np.ndarray, np.ndarray, list[str], list[int], list[str]]:
    tags = [line for line in (dataset / "tags.txt").read_text().splitlines() if line]
    index = {tag: i for i, tag in enumerate(tags)}
    connection = sqlite3.connect(dataset / "dataset.sqlite")
    rows = connection.execute("SELECT md5, file_ext, tag_string FROM posts ORDER BY id").fetchall()
    connection.close()
    images = np.empty((len(rows), size, size, 3), np.uint8)
    labels = np.zeros((len(rows), len(tags)), np.float32)
    for row, (md5, ext, tag_string) in enumerate(rows):
        path = dataset / "images" / md5[:2] / f"{md5}.{ext}"
        with Image.open(path) as picture:
            images[row] = np.asarray(picture.convert("RGB").resize((size, size), Image.BICUBIC))
        for tag in tag_string.split():
            if tag in index:
                labels[row, index[tag]] = 1.0
    return images, labels, tags, labels.sum(0).astype(int).tolist(), [row[2] for row in rows]


def to_input(batch: np.ndarray) -> torch.Tensor:
    """uint8 NHWC RGB -> float NCHW BGR in [-1, 1], as WD v3 taggers take."""
    x = torch.from_numpy(batch[..., ::-1].copy()).permute(0, 3, 1, 2).float() / 255.0
    return (x - 0.5) / 0.5


def shift(batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n, h, w, _ = batch.shape
    pad = h // 8
    padded = np.pad(batch, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=255)
    out = np.empty_like(batch)
    for i in range(n):
        dy, dx = rng.integers(0, 2 * pad + 1, 2)
        out[i] = padded[i, dy:dy + h, dx:dx + w]
    return out


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean over tags with a positive of the area under the precision-recall steps."""
    values = []
    for column in range(labels.shape[1]):
        truth = labels[:, column]
        if truth.sum() == 0:
            continue
        order = np.argsort(-scores[:, column], kind="stable")
        hits = truth[order]
        precision = np.cumsum(hits) / np.arange(1, len(hits) + 1)
        values.append(float((precision * hits).sum() / hits.sum()))
    return float(np.mean(values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--minutes", type=float, default=20.0, help="wall-clock budget of the training loop")
    parser.add_argument("--architecture", default=ARCHITECTURE,
                        help=f"{ARCHITECTURE} (shaped by --patch/--width/--depth/--heads) or convnext_NAME")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--warmup", type=float, default=0.05, help="share of the budget")
    parser.add_argument("--holdout", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    images, labels, tags, counts, tag_strings = load(args.dataset, args.size)
    groups = sorted(set(tag_strings))
    held_groups = {groups[i] for i in rng.permutation(len(groups))[:int(len(groups) * args.holdout)]}
    is_held = np.array([tag_string in held_groups for tag_string in tag_strings])
    held, train = np.flatnonzero(is_held), rng.permutation(np.flatnonzero(~is_held))
    if args.architecture == ARCHITECTURE:
        model_args = {"img_size": args.size, "patch_size": args.patch, "embed_dim": args.width,
                      "depth": args.depth, "num_heads": args.heads, **WD_STYLE}
    elif args.architecture.startswith("convnext_"):
        model_args = {}
    else:
        parser.error(f"--architecture: {args.architecture!r} is neither {ARCHITECTURE} nor convnext_NAME")
    model = timm.create_model(args.architecture, pretrained=False, num_classes=len(tags), **model_args)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    budget = args.minutes * 60
    print(f"{len(train)} posts to train on, {len(held)} held out, {len(tags)} tags; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters", flush=True)
    started, steps, seen, last_print = time.monotonic(), 0, 0, 0.0
    model.train()
    while time.monotonic() - started < budget:
        for start in range(0, len(train) - args.batch + 1, args.batch):
            elapsed = (time.monotonic() - started) / budget
            if elapsed >= 1:
                break
            scale = elapsed / args.warmup if elapsed < args.warmup else \
                0.5 * (1 + math.cos(math.pi * (elapsed - args.warmup) / (1 - args.warmup)))
            for group in optimizer.param_groups:
                group["lr"] = args.lr * scale
            chosen = train[start:start + args.batch]
            x = to_input(shift(images[chosen], rng))
            loss = loss_fn(model(x), torch.from_numpy(labels[chosen]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            seen += len(chosen)
            now = time.monotonic() - started
            if now - last_print > 60:
                last_print = now
                print(f"{now / 60:.1f} min: step {steps}, epoch {seen / len(train):.1f}, loss {loss.item():.4f}, "
                      f"lr {args.lr * scale:.2e}", flush=True)
        train = train[rng.permutation(len(train))]
    seconds = time.monotonic() - started
    model.eval()
    with torch.no_grad():
        scores = np.concatenate([torch.sigmoid(model(to_input(images[held[i:i + 256]]))).numpy()
                                 for i in range(0, len(held), 256)])
    held_map = average_precision(scores, labels[held])
    save(args.out, model, args.architecture, model_args, args.size, tags, counts)
    figures = {"architecture": args.architecture, "steps": steps, "epochs": round(seen / len(train), 2),
               "seconds": round(seconds, 1),
               "holdout_posts": int(len(held)), "holdout_map": round(held_map, 4), "tags": len(tags),
               "model_args": model_args, "lr": args.lr, "batch": args.batch, "seed": args.seed}
    (args.out / "pretrain.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures), flush=True)
    return 0


def save(out: Path, model, architecture: str, model_args: dict, size: int, tags: list[str],
         counts: list[int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = {"architecture": architecture, "num_classes": len(tags), "num_features": model.num_features,
              "global_pool": "avg", "model_args": model_args,
              "pretrained_cfg": {"input_size": [3, size, size], "mean": [0.5] * 3, "std": [0.5] * 3,
                                 "interpolation": "bicubic", "crop_pct": 1.0, "num_classes": len(tags),
                                 # timm's ViTs say so (and build for input_size); its ConvNeXts take any size.
                                 "fixed_input_size": not architecture.startswith("convnext_")}}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()},
              str(out / "model.safetensors"))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(("tag_id", "name", "category", "count"))
    for number, (tag, count) in enumerate(zip(tags, counts)):
        writer.writerow((number, tag, 0, count))
    (out / "selected_tags.csv").write_text(buffer.getvalue())


if __name__ == "__main__":
    sys.exit(main())
