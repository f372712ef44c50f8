"""timm's Eva as EVA02 configures it: options from (architecture, model_args), the Keras builder, the weight table.

The embedding, pooling and final norms are the ViT importer's (models.timm.vit), with its layer names, so the
ViT's parameter groups place every layer (layer_decay, weight decay, freezing). What EVA02 adds, each as timm
computes it:
- rotary position embedding (timm's RotaryEmbeddingCat, rope_type "cat") on the queries and keys of the patch
  tokens: x * cos + rotate(x) * sin per head, where the (tokens, head_dim) sin and cos tables are the angles of
  each patch's (row, column) position, scaled by ref_feat_shape / grid as timm scales them, times the
  frequencies 1 / temperature ** (i / (head_dim / 4)); prefix tokens get cos 1 and sin 0 (left unrotated).
  The tables and the fixed signed permutation `rotate` (interleaved pairs, or halves with rope_rotate_half)
  are computed at import and held by non-trainable Dense layers read from a constant 1, so an export holds
  only built-in layers and a resized model gets tables for its own grid;
- attention from separate q, k (no bias), v projections (a fused qkv with q_bias and v_bias is split), the
  scores and the weighted sum as einsum op nodes around a Softmax layer, an optional LayerNorm on its output
  (scale_attn_inner), then the projection;
- SwiGLU MLP: silu(fc1_g x) * fc1_x x, with its LayerNorm before fc2 (scale_mlp) as eva02_base/large have it
  (the packed fc1 of timm's GluMlp is split into the same two layers), or the plain GELU MLP;
- layer scale (init_values) folded into the projection before it, as in the ViT importer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import keras
import numpy as np
from keras import layers, ops

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm import parts, vit
from deepdanbooru.models.timm.vit import EPSILON, TokenLayout

# EVA02 sizes by name: (embed_dim, depth, num_heads, qkv_fused, scale_mlp), as timm's eva02_<size>_patch14_<img>
# functions set them (all: mlp_ratio 4 * 2 / 3, swiglu_mlp, rotary embedding, ref_feat_shape 16x16).
SIZES = {"tiny": (192, 12, 3, True, False), "small": (384, 12, 6, True, False),
         "base": (768, 12, 12, False, True), "large": (1024, 24, 16, False, True)}
NAME_PATTERN = re.compile(r"eva02_(tiny|small|base|large)_patch(\d+)_(\d+)")
SUPPORTED = "eva02_{" + ",".join(SIZES) + "}_patch<P>_<size>"
POOLS = ("avg", "token")
_TRAINING_ONLY = ("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                  "drop_path_rate", "head_init_scale", "rope_shift_coords", "rope_jitter_coords",
                  "rope_rescale_coords")
# Arguments with the one value supported (timm's default): anything else is refused by name.
_FIXED = {"rope_type": "cat", "attn_type": "eva", "use_rot_pos_emb": True, "qk_norm": False, "use_post_norm": False,
          "use_pre_transformer_norm": False, "attn_only_layer_scale": False, "swiglu_align_to": 0,
          "num_kv_heads": None, "dynamic_img_size": False, "dynamic_img_pad": False}
_KNOWN = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "qkv_fused",
          "swiglu_mlp", "scale_mlp", "scale_attn_inner", "init_values", "class_token", "num_reg_tokens",
          "no_embed_class", "use_abs_pos_emb", "rope_grid_offset", "rope_grid_indexing", "rope_temperature",
          "rope_rotate_half", "ref_feat_shape", "global_pool", "use_fc_norm", "use_post_transformer_norm",
          "num_classes", "in_chans") + tuple(_FIXED) + _TRAINING_ONLY
INDEXINGS = ("ij", "xy")


@dataclass(frozen=True)
class EvaOptions(TokenLayout):
    hidden: int  # the MLP's hidden width
    qkv_bias: bool
    qkv_fused: bool
    mlp: str  # "swiglu" (fc1_g, fc1_x), "packed" (GluMlp's fc1, split), "gelu" (fc1, fc2)
    scale_mlp: bool
    scale_attn_inner: bool
    layer_scale: bool
    class_token: bool
    reg_tokens: int
    no_embed_class: bool
    abs_pos: bool
    rope_temperature: float
    rope_offset: float
    rope_indexing: str
    rope_half: bool
    ref_feat_shape: tuple[int, int] | None
    pool: str
    norm: bool  # the final norm on every token, before pooling
    fc_norm: bool  # the norm after pooling
    num_classes: int

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def tokens(self) -> int:
        return self.prefix_tokens + self.patches


def options(architecture: str, model_args: dict, num_classes: int, path) -> EvaOptions:
    match = NAME_PATTERN.fullmatch(architecture)
    if not match:
        raise ModelError(file_field(path, "architecture", f"{architecture!r} is not an EVA02 ({SUPPORTED})"))
    width, depth, heads, fused, scale_mlp = SIZES[match.group(1)]
    args = parts.merged_args(architecture, model_args, _KNOWN, {
        **_FIXED, "patch_size": int(match.group(2)), "img_size": int(match.group(3)), "embed_dim": width,
        "depth": depth, "num_heads": heads, "mlp_ratio": 4 * 2 / 3, "qkv_bias": True, "qkv_fused": fused,
        "swiglu_mlp": True, "scale_mlp": scale_mlp, "scale_attn_inner": False, "init_values": None,
        "class_token": True, "num_reg_tokens": 0, "no_embed_class": False, "use_abs_pos_emb": True,
        "rope_grid_offset": 0.0, "rope_grid_indexing": "ij", "rope_temperature": 10000.0, "rope_rotate_half": False,
        "ref_feat_shape": [16, 16], "global_pool": "avg", "use_fc_norm": None, "use_post_transformer_norm": None},
        path)

    def fail(field, message):
        parts.fail(path, field, message)

    for field, value in _FIXED.items():
        if args[field] != value:
            fail(field, f"{json.dumps(args[field])} is not supported (only {json.dumps(value)}, timm's default)")
    pool, img_size, patch = vit.pooling_and_patches(args, POOLS, path)
    if args["rope_grid_indexing"] not in INDEXINGS:
        fail("rope_grid_indexing", f"{args['rope_grid_indexing']!r} is not one of {', '.join(INDEXINGS)}")
    width, heads = args["embed_dim"], args["num_heads"]
    if width % heads or (width // heads) % 4:
        fail("num_heads", f"{heads} must divide embed_dim {width} into heads of a multiple of 4 (rotary "
                          "embedding: two axes, sin and cos pairs)")
    reference = args["ref_feat_shape"]
    reference = None if reference is None else vit.pair(reference, "ref_feat_shape", path)
    swiglu, scale = bool(args["swiglu_mlp"]), bool(args["scale_mlp"])
    # timm: separate fc1_g and fc1_x when SwiGLU has its norm, one packed fc1 without it.
    mlp = ("swiglu" if scale else "packed") if swiglu else "gelu"
    fc_norm = pool == "avg" if args["use_fc_norm"] is None else bool(args["use_fc_norm"])
    norm = not fc_norm if args["use_post_transformer_norm"] is None else bool(args["use_post_transformer_norm"])
    return EvaOptions(img_size, patch, width, args["depth"], heads, int(width * args["mlp_ratio"]),
                      bool(args["qkv_bias"]), bool(args["qkv_fused"]), mlp, scale, bool(args["scale_attn_inner"]),
                      args["init_values"] is not None, bool(args["class_token"]), int(args["num_reg_tokens"]),
                      bool(args["no_embed_class"]), bool(args["use_abs_pos_emb"]), float(args["rope_temperature"]),
                      float(args["rope_grid_offset"]), args["rope_grid_indexing"], bool(args["rope_rotate_half"]),
                      reference, pool, norm, fc_norm, num_classes)


def input_size(opts: EvaOptions, pretrained_size, path=None) -> tuple[int, int]:
    return opts.img_size


def resized(opts: EvaOptions, tensors: dict, size, path=None) -> tuple[EvaOptions, dict]:
    """(options, tensors) for input `size`, as timm's set_input_size: the position table resampled as the ViT's,
    the rotary tables recomputed for the new grid (ref_feat_shape kept, so positions keep their scale)."""
    if opts.abs_pos:
        return vit.resized(opts, tensors, size, path)
    size = tuple(size)
    if size[0] % opts.patch or size[1] % opts.patch:
        raise ModelError(file_field(path, "model_args.patch_size", f"{opts.patch} does not divide the input "
                                                                    f"{size[1]}x{size[0]} asked for"))
    return replace(opts, img_size=size), tensors


# --- rotary position embedding: constants computed here ---

def rope_tables(opts: EvaOptions) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos), each (tokens, head_dim): timm's RotaryEmbeddingCat for the patch grid, identity rows for the
    prefix tokens."""
    bands = 1.0 / opts.rope_temperature ** (np.arange(opts.head_dim // 4, dtype=np.float64) / (opts.head_dim // 4))
    shape, reference = list(opts.grid), list(opts.ref_feat_shape) if opts.ref_feat_shape else None
    if opts.rope_indexing == "xy":
        shape, reference = shape[::-1], reference[::-1] if reference else None
    axes = [np.arange(side, dtype=np.float64) + opts.rope_offset for side in shape]
    if reference:
        axes = [axis / side * ref for axis, side, ref in zip(axes, shape, reference)]
    # meshgrid "xy" over the swapped sides lays positions out as (rows, columns) again, channel 0 the column.
    grid = np.stack(np.meshgrid(*axes, indexing=opts.rope_indexing), axis=-1)
    angles = (grid[..., None] * bands).reshape(opts.patches, -1)  # (patches, 2 axes x head_dim / 4)
    angles = np.concatenate([angles, angles], -1) if opts.rope_half else np.repeat(angles, 2, -1)
    sin = np.concatenate([np.zeros((opts.prefix_tokens, opts.head_dim)), np.sin(angles)])
    cos = np.concatenate([np.ones((opts.prefix_tokens, opts.head_dim)), np.cos(angles)])
    return sin, cos


def rotation(opts: EvaOptions) -> np.ndarray:
    """R with x @ R = timm's rot(x) ([-x1, x0, -x3, x2, ...]) or, with rope_rotate_half, [-x_back, x_front]."""
    d = opts.head_dim
    r = np.zeros((d, d))
    if opts.rope_half:
        half = d // 2
        r[np.arange(half) + half, np.arange(half)] = -1.0
        r[np.arange(half), np.arange(half) + half] = 1.0
    else:
        r[np.arange(1, d, 2), np.arange(0, d, 2)] = -1.0
        r[np.arange(0, d, 2), np.arange(1, d, 2)] = 1.0
    return r


# --- the Keras network ---

def _norm(name):
    return layers.LayerNormalization(epsilon=EPSILON, name=name)


def _heads(x, opts: EvaOptions, name: str):
    return layers.Reshape((opts.tokens, opts.heads, opts.head_dim), name=name)(x)


def _rotary(x, rope, name: str):
    sin, cos, rotate = rope
    turned = layers.Multiply(name=f"{name}_sin")([rotate(x), sin])
    return layers.Add(name=f"{name}_rotated")([layers.Multiply(name=f"{name}_cos")([x, cos]), turned])


def _attention(x, opts: EvaOptions, rope, name: str):
    d = opts.width
    q = _rotary(_heads(layers.Dense(d, use_bias=opts.qkv_bias, name=f"{name}_q")(x), opts, f"{name}_q_heads"),
                rope, f"{name}_q")
    k = _rotary(_heads(layers.Dense(d, use_bias=False, name=f"{name}_k")(x), opts, f"{name}_k_heads"),
                rope, f"{name}_k")
    v = _heads(layers.Dense(d, use_bias=opts.qkv_bias, name=f"{name}_v")(x), opts, f"{name}_v_heads")
    q = layers.Rescaling(opts.head_dim ** -0.5, name=f"{name}_q_scaled")(q)
    weights = layers.Softmax(axis=-1, name=f"{name}_softmax")(ops.einsum("bqhd,bkhd->bhqk", q, k))
    x = layers.Reshape((opts.tokens, d), name=f"{name}_joined")(ops.einsum("bhqk,bkhd->bqhd", weights, v))
    if opts.scale_attn_inner:
        x = _norm(f"{name}_norm")(x)
    return layers.Dense(d, name=f"{name}_proj")(x)


def _mlp(x, opts: EvaOptions, name: str):
    if opts.mlp == "gelu":
        y = layers.Activation("gelu", name=f"{name}_act")(layers.Dense(opts.hidden, name=f"{name}1")(x))
    else:
        gate = layers.Activation("silu", name=f"{name}_act")(layers.Dense(opts.hidden, name=f"{name}_gate")(x))
        y = layers.Multiply(name=f"{name}_gated")([gate, layers.Dense(opts.hidden, name=f"{name}_value")(x)])
    if opts.scale_mlp:
        y = _norm(f"{name}_norm")(y)
    return layers.Dense(opts.width, name=f"{name}2")(y)


def build(opts: EvaOptions, name: str, size=None) -> keras.Model:
    if size is not None and tuple(size) != tuple(opts.img_size):
        opts = replace(opts, img_size=tuple(size))
    image = keras.Input(shape=(*opts.img_size, 3), name="image")
    ones = parts.ones_like_batch(image)
    x = vit.embed(image, ones, opts, position_table=opts.abs_pos)
    table = (opts.tokens, 1, opts.head_dim)
    rope = (parts.constant(ones, table, "vit_rope_sin"), parts.constant(ones, table, "vit_rope_cos"),
            layers.Dense(opts.head_dim, use_bias=False, trainable=False, name="vit_rope_rotate"))
    for index in range(opts.depth):
        block = f"vit_block{index}"
        y = _attention(_norm(f"{block}_norm1")(x), opts, rope, f"{block}_attn")
        x = layers.Add(name=f"{block}_add1")([x, y])
        x = layers.Add(name=f"{block}_add2")([x, _mlp(_norm(f"{block}_norm2")(x), opts, f"{block}_mlp")])
    if opts.norm:
        x = _norm("vit_norm")(x)
    return vit.head(image, vit.pool(x, opts), opts, name)


# --- the weight table ---

def _linear_tensors(prefix, out, inp, bias=True):
    return {f"{prefix}.weight": (out, inp), **({f"{prefix}.bias": (out,)} if bias else {})}


def expected_tensors(opts: EvaOptions, head: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, with its shape (timm's rotary tables are buffers, not stored)."""
    w, h = opts.width, opts.hidden
    out = vit.embedding_tensors(opts, position_table=opts.abs_pos)
    for index in range(opts.depth):
        block = f"blocks.{index}"
        out.update(vit.norm_tensors(f"{block}.norm1", w))
        if opts.qkv_fused:
            out[f"{block}.attn.qkv.weight"] = (3 * w, w)
            if opts.qkv_bias:
                out.update({f"{block}.attn.q_bias": (w,), f"{block}.attn.v_bias": (w,)})
        else:
            out.update(_linear_tensors(f"{block}.attn.q_proj", w, w, opts.qkv_bias))
            out.update(_linear_tensors(f"{block}.attn.k_proj", w, w, False))
            out.update(_linear_tensors(f"{block}.attn.v_proj", w, w, opts.qkv_bias))
        if opts.scale_attn_inner:
            out.update(vit.norm_tensors(f"{block}.attn.norm", w))
        out.update(_linear_tensors(f"{block}.attn.proj", w, w))
        if opts.layer_scale:
            out.update({f"{block}.gamma_1": (w,), f"{block}.gamma_2": (w,)})
        out.update(vit.norm_tensors(f"{block}.norm2", w))
        if opts.mlp == "swiglu":
            out.update({**_linear_tensors(f"{block}.mlp.fc1_g", h, w), **_linear_tensors(f"{block}.mlp.fc1_x", h, w)})
        else:
            out.update(_linear_tensors(f"{block}.mlp.fc1", 2 * h if opts.mlp == "packed" else h, w))
        if opts.scale_mlp:
            out.update(vit.norm_tensors(f"{block}.mlp.norm", h))
        out.update(_linear_tensors(f"{block}.mlp.fc2", w, h))
    if opts.norm:
        out.update(vit.norm_tensors("norm", w))
    if opts.fc_norm:
        out.update(vit.norm_tensors("fc_norm", w))
    if head:
        out.update(_linear_tensors("head", opts.num_classes, w))
    return out


def _dense(t, prefix, scale=None, rows=slice(None)):
    """A Dense layer's [kernel(, bias)] from torch's Linear `prefix` (optionally some of its output rows),
    times a layer scale."""
    kernel = t[f"{prefix}.weight"][rows].T
    bias = t[f"{prefix}.bias"][rows] if f"{prefix}.bias" in t else None
    if scale is not None:
        kernel, bias = kernel * scale, bias * scale
    return [kernel] if bias is None else [kernel, bias]


def _attention_weights(opts: EvaOptions, t: dict, block: str, name: str) -> dict:
    w = opts.width
    out = {}
    if opts.qkv_fused:
        qkv = t[f"{block}.attn.qkv.weight"]
        out[f"{name}_q"] = [qkv[:w].T] + ([t[f"{block}.attn.q_bias"]] if opts.qkv_bias else [])
        out[f"{name}_k"] = [qkv[w:2 * w].T]
        out[f"{name}_v"] = [qkv[2 * w:].T] + ([t[f"{block}.attn.v_bias"]] if opts.qkv_bias else [])
    else:
        for part in "qkv":
            out[f"{name}_{part}"] = _dense(t, f"{block}.attn.{part}_proj")
    if opts.scale_attn_inner:
        out[f"{name}_norm"] = vit.norm_weights(t, f"{block}.attn.norm")
    out[f"{name}_proj"] = _dense(t, f"{block}.attn.proj", t.get(f"{block}.gamma_1"))
    return out


def _mlp_weights(opts: EvaOptions, t: dict, block: str, name: str) -> dict:
    h = opts.hidden
    source = f"{block}.mlp"
    if opts.mlp == "swiglu":
        out = {f"{name}_gate": _dense(t, f"{source}.fc1_g"), f"{name}_value": _dense(t, f"{source}.fc1_x")}
    elif opts.mlp == "packed":
        # GluMlp with gate_last false: the first half of fc1 goes through silu, the second is the value.
        out = {f"{name}_gate": _dense(t, f"{source}.fc1", rows=slice(0, h)),
               f"{name}_value": _dense(t, f"{source}.fc1", rows=slice(h, 2 * h))}
    else:
        out = {f"{name}1": _dense(t, f"{source}.fc1")}
    if opts.scale_mlp:
        out[f"{name}_norm"] = vit.norm_weights(t, f"{source}.norm")
    out[f"{name}2"] = _dense(t, f"{source}.fc2", t.get(f"{block}.gamma_2"))
    return out


def layer_weights(opts: EvaOptions, t: dict, fold, name: str = "") -> dict[str, list[np.ndarray]]:
    """Layer name -> weights for the whole imported model; `fold(kernel, bias)` adapts the patch embedding."""
    out = vit.embedding_weights(opts, t, fold)
    sin, cos = rope_tables(opts)
    out.update({"vit_rope_sin": [sin.reshape(1, -1)], "vit_rope_cos": [cos.reshape(1, -1)],
                "vit_rope_rotate": [rotation(opts)]})
    for index in range(opts.depth):
        block, layer = f"blocks.{index}", f"vit_block{index}"
        out[f"{layer}_norm1"] = vit.norm_weights(t, f"{block}.norm1")
        out.update(_attention_weights(opts, t, block, f"{layer}_attn"))
        out[f"{layer}_norm2"] = vit.norm_weights(t, f"{block}.norm2")
        out.update(_mlp_weights(opts, t, block, f"{layer}_mlp"))
    if opts.norm:
        out["vit_norm"] = vit.norm_weights(t, "norm")
    if opts.fc_norm:
        out["vit_fc_norm"] = vit.norm_weights(t, "fc_norm")
    out["head_dense"] = _dense(t, "head")
    return out

