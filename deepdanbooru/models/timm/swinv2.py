"""timm's SwinTransformerV2: options from (architecture, model_args), the Keras builder, the weight table.

Window attention in built-in layers and a few op nodes (einsum), NHWC:
windows are cut and put back with Reshape/Permute, the cyclic shift is two
crops and a concatenation, attention is cosine (UnitNormalization of q and
k) times a per-head scale, plus a relative position bias, plus (shifted
blocks) the mask that keeps wrapped-around regions apart; blocks are
post-norm (x + norm(attn(x)), x + norm(mlp(x))); patch merging concatenates
each 2x2 neighbourhood in timm's order (rows, then columns), reduces and
normalises. LayerNorm eps is 1e-5 here.

What timm recomputes from buffers becomes a weight at import: the position
bias (timm's 16 * sigmoid(cpb_mlp(log-spaced coordinates)), per head and
query/key pair) and the per-head scale exp(min(logit_scale, log 100)) are
the values their layers hold, so the imported model computes what timm
computes and fine-tunes them as free parameters; the shift masks are
constants held by non-trainable layers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import keras
import numpy as np
from keras import layers, ops

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm import parts

EPSILON = 1e-5  # torch's nn.LayerNorm default, which timm's SwinV2 uses
# name -> (embed_dim, depths, num_heads), as timm's swinv2_<size>_window<W>_<img> functions set them.
SIZES = {"tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24)), "small": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
         "base": (128, (2, 2, 18, 2), (4, 8, 16, 32)), "large": (192, (2, 2, 18, 2), (6, 12, 24, 48))}
NAME_PATTERN = re.compile(r"swinv2_(tiny|small|base|large)_window(\d+)_(\d+)")
SUPPORTED = "swinv2_{" + ",".join(SIZES) + "}_window<W>_<size>"
_TRAINING_ONLY = ("drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate")
_KNOWN = ("img_size", "patch_size", "embed_dim", "depths", "num_heads", "window_size", "mlp_ratio", "qkv_bias",
          "act_layer", "pretrained_window_sizes", "num_classes", "in_chans", "global_pool") + _TRAINING_ONLY
_MASKED = -100.0  # timm's value for query/key pairs from different regions of a shifted window
_CPB_HIDDEN = 512


@dataclass(frozen=True)
class Block:
    stage: int
    index: int
    width: int
    heads: int
    resolution: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]
    pretrained_window: int


@dataclass(frozen=True)
class SwinV2Options:
    img_size: tuple[int, int]
    patch: int
    widths: tuple[int, ...]
    blocks: tuple[Block, ...]
    mlp_ratio: float
    qkv_bias: bool
    act: str
    num_classes: int


def options(architecture: str, model_args: dict, num_classes: int, path) -> SwinV2Options:
    match = NAME_PATTERN.fullmatch(architecture)
    if not match:
        raise ModelError(file_field(path, "architecture", f"{architecture!r} is not a plain SwinV2 ({SUPPORTED})"))
    embed, depths, heads = SIZES[match.group(1)]
    args = parts.merged_args(architecture, model_args, _KNOWN, {
        "img_size": int(match.group(3)), "window_size": int(match.group(2)), "embed_dim": embed, "depths": depths,
        "num_heads": heads, "patch_size": 4, "mlp_ratio": 4.0, "qkv_bias": True,
        "pretrained_window_sizes": (0, 0, 0, 0), "global_pool": "avg"}, path)

    def fail(field, message):
        parts.fail(path, field, message)

    if args["global_pool"] != "avg":
        fail("global_pool", f"{args['global_pool']!r} is not supported (avg)")
    act = args["act_layer"]
    size = args["img_size"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    window = args["window_size"]
    if not isinstance(window, int):
        fail("window_size", f"must be one integer, got {window!r}")
    depths, heads, patch = tuple(args["depths"]), tuple(args["num_heads"]), args["patch_size"]
    if len(heads) != len(depths) or len(args["pretrained_window_sizes"]) < len(depths):
        fail("num_heads", f"needs one value per stage ({len(depths)})")
    if size[0] % patch or size[1] % patch:
        fail("patch_size", f"{patch} does not divide img_size {list(size)}")
    widths = tuple(args["embed_dim"] * 2**stage for stage in range(len(depths)))
    resolution = (size[0] // patch, size[1] // patch)
    blocks = []
    for stage, (depth, count) in enumerate(zip(depths, heads)):
        if stage:
            if resolution[0] % 2 or resolution[1] % 2:
                fail("img_size", f"stage {stage} merges 2x2 patches of a {resolution[0]}x{resolution[1]} grid; "
                                 "odd grids (padded by timm) are not supported")
            resolution = (resolution[0] // 2, resolution[1] // 2)
        if widths[stage] % count:
            fail("num_heads", f"{count} does not divide stage {stage}'s width {widths[stage]}")
        # timm: a window no larger than the grid, and no shift where one window covers the grid.
        windows = tuple(min(r, window) for r in resolution)
        for index in range(depth):
            shift = tuple(0 if index % 2 == 0 or r <= w else window // 2 for r, w in zip(resolution, windows))
            if resolution[0] % windows[0] or resolution[1] % windows[1]:
                fail("window_size", f"stage {stage}'s {resolution[0]}x{resolution[1]} grid is not a whole number "
                                    f"of {windows[0]}x{windows[1]} windows (padded by timm; not supported)")
            blocks.append(Block(stage, index, widths[stage], count, resolution, windows, shift,
                                int(args["pretrained_window_sizes"][stage])))
    return SwinV2Options(size, patch, widths, tuple(blocks), float(args["mlp_ratio"]), bool(args["qkv_bias"]), act,
                         num_classes)


def input_size(opts: SwinV2Options, pretrained_size, path=None) -> tuple[int, int]:
    # Windows and masks are made for img_size; timm refuses any other size unless built dynamic.
    return opts.img_size


def _roll(x, shift: tuple[int, int], size: tuple[int, int], name: str):
    """torch.roll(x, shift, dims=(1, 2)) for non-negative shifts smaller than the sides: crops and concatenations."""
    for axis, (amount, side) in enumerate(zip(shift, size)):
        if not amount % side:
            continue
        amount %= side
        tail = ((side - amount, 0), (0, 0)) if axis == 0 else ((0, 0), (side - amount, 0))
        head = ((0, amount), (0, 0)) if axis == 0 else ((0, 0), (0, amount))
        tail = layers.Cropping2D(tail, name=f"{name}_{axis}_tail")(x)
        x = layers.Concatenate(axis=axis + 1, name=f"{name}_{axis}")(
            [tail, layers.Cropping2D(head, name=f"{name}_{axis}_head")(x)])
    return x


def _attention(x, block: Block, ones, name: str):
    (height, width), (wh, ww) = block.resolution, block.window
    c, heads = block.width, block.heads
    n, windows = wh * ww, (height // wh) * (width // ww)
    if any(block.shift):
        x = _roll(x, (height - block.shift[0], width - block.shift[1]), (height, width), f"{name}_shift")
    x = layers.Reshape((height // wh, wh, width // ww, ww, c), name=f"{name}_cut")(x)
    x = layers.Permute((1, 3, 2, 4, 5), name=f"{name}_windows")(x)
    x = layers.Reshape((windows, n, c), name=f"{name}_tokens")(x)

    def split(tensor, part):
        tensor = layers.Reshape((windows, n, heads, c // heads), name=f"{name}_{part}_heads")(tensor)
        return layers.Permute((1, 3, 2, 4), name=f"{name}_{part}_by_head")(tensor)

    q = split(layers.Dense(c, name=f"{name}_q")(x), "q")
    k = split(layers.Dense(c, use_bias=False, name=f"{name}_k")(x), "k")
    v = split(layers.Dense(c, name=f"{name}_v")(x), "v")
    q = layers.UnitNormalization(axis=-1, name=f"{name}_q_unit")(q)
    k = layers.UnitNormalization(axis=-1, name=f"{name}_k_unit")(k)
    scores = ops.einsum("bwhnd,bwhmd->bwhnm", q, k)
    scale = layers.Reshape((1, heads, 1, 1), name=f"{name}_scale_shape")(
        layers.Dense(heads, use_bias=False, name=f"{name}_scale")(ones))
    scores = layers.Multiply(name=f"{name}_scaled")([scores, scale])
    bias = parts.parameter(ones, (1, heads, n, n), f"{name}_position_bias")
    scores = layers.Add(name=f"{name}_biased")([scores, bias])
    if any(block.shift):
        mask = layers.Dense(windows * n * n, use_bias=False, trainable=False, name=f"{name}_mask")(ones)
        mask = layers.Reshape((windows, 1, n, n), name=f"{name}_mask_shape")(mask)
        scores = layers.Add(name=f"{name}_masked")([scores, mask])
    weights = layers.Softmax(axis=-1, name=f"{name}_softmax")(scores)
    x = ops.einsum("bwhnm,bwhmd->bwhnd", weights, v)
    x = layers.Permute((1, 3, 2, 4), name=f"{name}_by_token")(x)
    x = layers.Reshape((windows, n, c), name=f"{name}_joined")(x)
    x = layers.Dense(c, name=f"{name}_proj")(x)
    x = layers.Reshape((height // wh, width // ww, wh, ww, c), name=f"{name}_uncut")(x)
    x = layers.Permute((1, 3, 2, 4, 5), name=f"{name}_rows")(x)
    x = layers.Reshape((height, width, c), name=f"{name}_grid")(x)
    if any(block.shift):
        x = _roll(x, block.shift, (height, width), f"{name}_unshift")
    return x


def _norm(name):
    return layers.LayerNormalization(epsilon=EPSILON, name=name)


def _merge(x, stage: int, resolution, width: int):
    """timm's PatchMerging: each 2x2 neighbourhood's four vectors (column-major), reduced to `width`, normed."""
    height, cols = resolution
    channels = int(x.shape[-1])
    name = f"swin_merge{stage}"
    x = layers.Reshape((height // 2, 2, cols // 2, 2, channels), name=f"{name}_cut")(x)
    x = layers.Permute((1, 3, 4, 2, 5), name=f"{name}_order")(x)
    x = layers.Reshape((height // 2, cols // 2, 4 * channels), name=f"{name}_joined")(x)
    x = layers.Dense(width, use_bias=False, name=f"{name}_reduction")(x)
    return _norm(f"{name}_norm")(x)


def build(opts: SwinV2Options, name: str, size=None) -> keras.Model:
    image = keras.Input(shape=(*opts.img_size, 3), name="image")
    ones = parts.ones_like_batch(image)
    x = layers.Conv2D(opts.widths[0], opts.patch, strides=opts.patch, name="swin_patch_embedding")(image)
    x = _norm("swin_patch_norm")(x)
    for block in opts.blocks:
        if block.stage and block.index == 0:
            previous = (block.resolution[0] * 2, block.resolution[1] * 2)
            x = _merge(x, block.stage, previous, block.width)
        prefix = f"swin_stage{block.stage}_block{block.index}"
        x = layers.Add(name=f"{prefix}_add1")([x, _norm(f"{prefix}_norm1")(_attention(x, block, ones, prefix))])
        y = layers.Dense(int(opts.mlp_ratio * block.width), name=f"{prefix}_mlp1")(x)
        y = layers.Dense(block.width, name=f"{prefix}_mlp2")(parts.activation(y, opts.act, f"{prefix}_mlp_act"))
        x = layers.Add(name=f"{prefix}_add2")([x, _norm(f"{prefix}_norm2")(y)])
    x = _norm("swin_norm")(x)
    x = layers.GlobalAveragePooling2D(name="head_pool")(x)
    x = layers.Dense(opts.num_classes, name="head_dense")(x)
    outputs = layers.Activation("sigmoid", dtype="float32", name="output")(x)
    return keras.Model(image, outputs, name=name)


# --- the weight table ---

def _source(block: Block) -> str:
    return f"layers.{block.stage}.blocks.{block.index}"


def expected_tensors(opts: SwinV2Options, head: bool = True) -> dict[str, tuple[int, ...]]:
    first = opts.widths[0]
    out = {"patch_embed.proj.weight": (first, 3, opts.patch, opts.patch), "patch_embed.proj.bias": (first,),
           "patch_embed.norm.weight": (first,), "patch_embed.norm.bias": (first,)}
    for block in opts.blocks:
        c, prefix = block.width, _source(block)
        if block.stage and block.index == 0:
            merge = f"layers.{block.stage}.downsample"
            out.update({f"{merge}.reduction.weight": (c, 2 * c), f"{merge}.norm.weight": (c,),
                        f"{merge}.norm.bias": (c,)})
        hidden = int(opts.mlp_ratio * c)
        out.update({f"{prefix}.attn.logit_scale": (block.heads, 1, 1),
                    f"{prefix}.attn.cpb_mlp.0.weight": (_CPB_HIDDEN, 2),
                    f"{prefix}.attn.cpb_mlp.0.bias": (_CPB_HIDDEN,),
                    f"{prefix}.attn.cpb_mlp.2.weight": (block.heads, _CPB_HIDDEN),
                    f"{prefix}.attn.qkv.weight": (3 * c, c), f"{prefix}.attn.proj.weight": (c, c),
                    f"{prefix}.attn.proj.bias": (c,), f"{prefix}.norm1.weight": (c,), f"{prefix}.norm1.bias": (c,),
                    f"{prefix}.mlp.fc1.weight": (hidden, c), f"{prefix}.mlp.fc1.bias": (hidden,),
                    f"{prefix}.mlp.fc2.weight": (c, hidden), f"{prefix}.mlp.fc2.bias": (c,),
                    f"{prefix}.norm2.weight": (c,), f"{prefix}.norm2.bias": (c,)})
        if opts.qkv_bias:
            out.update({f"{prefix}.attn.q_bias": (c,), f"{prefix}.attn.v_bias": (c,)})
    last = opts.widths[-1]
    out.update({"norm.weight": (last,), "norm.bias": (last,)})
    if head:
        out.update({"head.fc.weight": (opts.num_classes, last), "head.fc.bias": (opts.num_classes,)})
    return out


def _position_bias(block: Block, t: dict) -> np.ndarray:
    """timm's 16 * sigmoid(cpb_mlp(table))[relative_position_index] as (heads, n, n)."""
    wh, ww = block.window
    coords = np.stack(np.meshgrid(np.arange(-(wh - 1), wh, dtype=np.float64),
                                  np.arange(-(ww - 1), ww, dtype=np.float64), indexing="ij"), axis=-1)
    reference = (block.pretrained_window, block.pretrained_window) if block.pretrained_window else (wh, ww)
    coords[..., 0] /= max(reference[0] - 1, 1)
    coords[..., 1] /= max(reference[1] - 1, 1)
    coords *= 8
    coords = np.sign(coords) * np.log2(np.abs(coords) + 1.0) / math.log2(8)
    prefix = f"{_source(block)}.attn.cpb_mlp"
    hidden = np.maximum(coords @ t[f"{prefix}.0.weight"].T.astype(np.float64) + t[f"{prefix}.0.bias"], 0.0)
    table = (hidden @ t[f"{prefix}.2.weight"].T.astype(np.float64)).reshape(-1, block.heads)
    grid = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)
    relative = (grid[:, :, None] - grid[:, None, :]).transpose(1, 2, 0)
    index = (relative[..., 0] + wh - 1) * (2 * ww - 1) + (relative[..., 1] + ww - 1)
    bias = table[index.reshape(-1)].reshape(wh * ww, wh * ww, block.heads).transpose(2, 0, 1)
    return 16.0 / (1.0 + np.exp(-bias))


def _shift_mask(block: Block) -> np.ndarray:
    """timm's attention mask of a shifted block: (windows, n, n), 0 within a region, -100 across."""
    (height, width), (wh, ww), (sh, sw) = block.resolution, block.window, block.shift
    regions = np.zeros((height, width))
    count = 0
    for rows in (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)):
        for cols in (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)):
            regions[rows, cols] = count
            count += 1
    windows = regions.reshape(height // wh, wh, width // ww, ww).transpose(0, 2, 1, 3).reshape(-1, wh * ww)
    return np.where(windows[:, None, :] != windows[:, :, None], _MASKED, 0.0)


def layer_weights(opts: SwinV2Options, t: dict, fold, name: str = "") -> dict[str, list[np.ndarray]]:
    out = {"swin_patch_embedding": list(fold(t["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
                                             t["patch_embed.proj.bias"])),
           "swin_patch_norm": [t["patch_embed.norm.weight"], t["patch_embed.norm.bias"]]}
    for block in opts.blocks:
        c, source, prefix = block.width, _source(block), f"swin_stage{block.stage}_block{block.index}"
        if block.stage and block.index == 0:
            merge = f"layers.{block.stage}.downsample"
            out[f"swin_merge{block.stage}_reduction"] = [t[f"{merge}.reduction.weight"].T]
            out[f"swin_merge{block.stage}_norm"] = [t[f"{merge}.norm.weight"], t[f"{merge}.norm.bias"]]
        qkv = t[f"{source}.attn.qkv.weight"]
        zeros = np.zeros(c, np.float32)
        out[f"{prefix}_q"] = [qkv[:c].T, t.get(f"{source}.attn.q_bias", zeros)]
        out[f"{prefix}_k"] = [qkv[c:2 * c].T]
        out[f"{prefix}_v"] = [qkv[2 * c:].T, t.get(f"{source}.attn.v_bias", zeros)]
        scale = np.exp(np.minimum(t[f"{source}.attn.logit_scale"].reshape(-1), math.log(100.0)))
        out[f"{prefix}_scale"] = [scale.reshape(1, -1)]
        out[f"{prefix}_position_bias"] = [_position_bias(block, t).reshape(1, -1)]
        if any(block.shift):
            out[f"{prefix}_mask"] = [_shift_mask(block).reshape(1, -1)]
        out[f"{prefix}_proj"] = [t[f"{source}.attn.proj.weight"].T, t[f"{source}.attn.proj.bias"]]
        for norm in ("norm1", "norm2"):
            out[f"{prefix}_{norm}"] = [t[f"{source}.{norm}.weight"], t[f"{source}.{norm}.bias"]]
        out[f"{prefix}_mlp1"] = [t[f"{source}.mlp.fc1.weight"].T, t[f"{source}.mlp.fc1.bias"]]
        out[f"{prefix}_mlp2"] = [t[f"{source}.mlp.fc2.weight"].T, t[f"{source}.mlp.fc2.bias"]]
    out["swin_norm"] = [t["norm.weight"], t["norm.bias"]]
    out["head_dense"] = [t["head.fc.weight"].T, t["head.fc.bias"]]
    return out
