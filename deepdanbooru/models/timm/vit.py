"""timm's VisionTransformer: options from (architecture, model_args), the Keras builder, the weight table.

Layer names follow the registry's ViT (models.vit) wherever the layer is the
same one (patch embedding, position table, blocks, final norm), so the same
table fills either model (models.timm_trunk). Differences from the registry's
trunk, each from timm: optional class and register tokens, position table
over prefix tokens or patches only (no_embed_class), pooling by class
token, mean over patch tokens or attention pool (MAP), the final norm either
before pooling or after it (fc_norm), layer scale (folded into the
projection before it: gamma * (W x + b) is a Dense with kernel W * gamma),
q/k/v without bias (zero biases here), gelu or gelu_tanh.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import keras
import numpy as np
from keras import layers

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm import parts

EPSILON = 1e-6  # timm's LayerNorm
# ViT sizes by name: (embed_dim, depth, num_heads), as timm's vit_<size>_patch<P>_<img> functions set them.
SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16),
         "huge": (1280, 32, 16)}
NAME_PATTERN = re.compile(r"vit_(tiny|small|base|large|huge)_patch(\d+)_(\d+)")
SUPPORTED = "vit_{" + ",".join(SIZES) + "}_patch<P>_<size>"
POOLS = ("token", "avg", "map")
# Arguments that change training only (dropout, init), not what a trained model computes.
_TRAINING_ONLY = ("drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                  "drop_path_rate", "weight_init", "fix_init", "dynamic_img_size", "dynamic_img_pad")
_KNOWN = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "init_values",
          "class_token", "no_embed_class", "reg_tokens", "global_pool", "fc_norm", "act_layer", "num_classes",
          "in_chans", "final_norm") + _TRAINING_ONLY


@dataclass(frozen=True)
class TokenLayout:
    """The shape of a ViT-like network (ViT, EVA02): its blocks, and its token sequence (the subclass's
    class_token, reg_tokens and no_embed_class: prefix tokens, then the patch grid)."""

    img_size: tuple[int, int]
    patch: int
    width: int
    depth: int
    heads: int

    @property
    def prefix_tokens(self) -> int:
        return int(self.class_token) + self.reg_tokens

    @property
    def grid(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch, self.img_size[1] // self.patch

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def table_length(self) -> int:
        return self.patches if self.no_embed_class else self.patches + self.prefix_tokens


@dataclass(frozen=True)
class ViTOptions(TokenLayout):
    mlp_width: int
    qkv_bias: bool
    layer_scale: bool
    class_token: bool
    reg_tokens: int
    no_embed_class: bool
    pool: str
    fc_norm: bool  # the final norm runs after pooling (else before it, on every token)
    act: str
    num_classes: int


def pair(value, field, path):
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return tuple(value)
    raise ModelError(file_field(path, f"model_args.{field}", f"must be a positive integer or [height, width], "
                                                              f"got {value!r}"))


def pooling_and_patches(args: dict, pools, path) -> tuple[str, tuple[int, int], int]:
    """(global_pool, img_size, patch_size) of merged model_args, checked: a pooling of `pools` (token needs the
    class token), patches that tile the image."""
    pool = args["global_pool"]
    if pool not in pools:
        parts.fail(path, "global_pool", f"{pool!r} is not supported (supported: {', '.join(pools)})")
    if pool == "token" and not args["class_token"]:
        parts.fail(path, "global_pool", "token pooling needs class_token true")
    img_size, patch = pair(args["img_size"], "img_size", path), args["patch_size"]
    if not isinstance(patch, int) or patch <= 0 or img_size[0] % patch or img_size[1] % patch:
        parts.fail(path, "patch_size", f"{patch!r} must be a positive integer dividing img_size {list(img_size)}")
    return pool, img_size, patch


def options(architecture: str, model_args: dict, num_classes: int, path) -> ViTOptions:
    match = NAME_PATTERN.fullmatch(architecture)
    if not match:
        raise ModelError(file_field(path, "architecture", f"{architecture!r} is not a plain ViT ({SUPPORTED})"))
    width, depth, heads = SIZES[match.group(1)]
    args = parts.merged_args(architecture, model_args, _KNOWN, {
        "patch_size": int(match.group(2)), "img_size": int(match.group(3)), "embed_dim": width, "depth": depth,
        "num_heads": heads, "mlp_ratio": 4.0, "qkv_bias": True, "init_values": None, "class_token": True,
        "no_embed_class": False, "reg_tokens": 0, "global_pool": "token", "fc_norm": None, "final_norm": True}, path)

    def fail(field, message):
        parts.fail(path, field, message)

    if not args["final_norm"]:
        fail("final_norm", "false is not supported")
    pool, img_size, patch = pooling_and_patches(args, POOLS, path)
    act = args["act_layer"]
    width, heads = args["embed_dim"], args["num_heads"]
    if width % heads:
        fail("num_heads", f"{heads} does not divide embed_dim {width}")
    fc_norm = pool == "avg" if args["fc_norm"] is None else bool(args["fc_norm"])
    return ViTOptions(img_size, patch, width, args["depth"], heads, int(args["mlp_ratio"] * width),
                      bool(args["qkv_bias"]), args["init_values"] is not None, bool(args["class_token"]),
                      int(args["reg_tokens"]), bool(args["no_embed_class"]), pool, fc_norm, act, num_classes)


def input_size(opts: ViTOptions, pretrained_size, path=None) -> tuple[int, int]:
    # The position table is made for img_size; timm refuses any other size unless built dynamic.
    return opts.img_size


def resized(opts: ViTOptions, tensors: dict, size, path=None) -> tuple[ViTOptions, dict]:
    """(options, tensors) for input `size`: the position table's patch rows resampled bicubically onto the new
    token grid (a position is where it was, relative to the picture); prefix-token rows are kept."""
    size = tuple(size)
    if size[0] % opts.patch or size[1] % opts.patch:
        raise ModelError(file_field(path, "model_args.patch_size", f"{opts.patch} does not divide the input "
                                                                    f"{size[1]}x{size[0]} asked for"))
    new = replace(opts, img_size=size)
    table = tensors["pos_embed"].reshape(opts.table_length, opts.width)
    prefix = 0 if opts.no_embed_class else opts.prefix_tokens
    rows = np.concatenate([table[:prefix], parts.resample_grid(table[prefix:], opts.grid, new.grid)])
    return new, {**tensors, "pos_embed": rows.reshape(1, new.table_length, opts.width)}


def _norm(name):
    return layers.LayerNormalization(epsilon=EPSILON, name=name)


def _mlp(x, opts: ViTOptions, name: str):
    y = layers.Dense(opts.mlp_width, name=f"{name}1")(x)
    y = parts.activation(y, opts.act, f"{name}_act")
    return layers.Dense(opts.width, name=f"{name}2")(y)


def _attention(opts: ViTOptions, name: str):
    return layers.MultiHeadAttention(opts.heads, opts.width // opts.heads, name=name)


def embed(image, ones, opts, position_table: bool = True):
    """Patch tokens with the prefix tokens (class, registers) in front and the learned position table added
    (over prefix and patches, or patches only with no_embed_class): (batch, prefix + patches, width)."""
    x = layers.Conv2D(opts.width, opts.patch, strides=opts.patch, padding="valid", name="vit_patch_embedding")(image)
    x = layers.Reshape((opts.patches, opts.width), name="vit_tokens")(x)
    prefix = []
    if opts.class_token:
        prefix.append(parts.parameter(ones, (1, opts.width), "vit_class_token"))
    if opts.reg_tokens:
        prefix.append(parts.parameter(ones, (opts.reg_tokens, opts.width), "vit_register_tokens"))
    table = parts.parameter(ones, (opts.table_length, opts.width), "vit_position_embedding") if position_table \
        else None
    if table is not None and opts.no_embed_class:
        x = layers.Add(name="vit_embedded")([x, table])
    if prefix:
        x = layers.Concatenate(axis=1, name="vit_with_prefix")([*prefix, x])
    if table is not None and not opts.no_embed_class:
        x = layers.Add(name="vit_embedded")([x, table])
    return x


def pool(x, opts):
    """The class token (pool token) or the mean of the patch tokens (avg): (batch, width)."""
    if opts.pool == "token":
        x = layers.Cropping1D((0, opts.patches + opts.prefix_tokens - 1), name="vit_class_output")(x)
        return layers.Reshape((opts.width,), name="vit_pooled")(x)
    if opts.prefix_tokens:
        x = layers.Cropping1D((opts.prefix_tokens, 0), name="vit_patch_tokens")(x)
    return layers.GlobalAveragePooling1D(name="vit_pooled")(x)


def build(opts: ViTOptions, name: str, size=None) -> keras.Model:
    image = keras.Input(shape=(*(size or opts.img_size), 3), name="image")
    ones = parts.ones_like_batch(image)
    x = embed(image, ones, opts)
    for index in range(opts.depth):
        block = f"vit_block{index}"
        y = _norm(f"{block}_norm1")(x)
        y = _attention(opts, f"{block}_attention")(y, y)
        x = layers.Add(name=f"{block}_add1")([x, y])
        y = _mlp(_norm(f"{block}_norm2")(x), opts, f"{block}_mlp")
        x = layers.Add(name=f"{block}_add2")([x, y])
    if not opts.fc_norm:
        x = _norm("vit_norm")(x)
    if opts.pool != "map":
        x = pool(x, opts)
    else:
        if opts.prefix_tokens:
            x = layers.Cropping1D((opts.prefix_tokens, 0), name="vit_patch_tokens")(x)
        latent = parts.parameter(ones, (1, opts.width), "vit_map_latent")
        y = _attention(opts, "vit_map_attention")(latent, x)
        y = layers.Add(name="vit_map_add")([y, _mlp(_norm("vit_map_norm")(y), opts, "vit_map_mlp")])
        x = layers.Reshape((opts.width,), name="vit_pooled")(y)
    return head(image, x, opts, name)


def head(image, pooled, opts, name: str) -> keras.Model:
    """The model from the pooled features: fc_norm when the options say so, the head, float32 sigmoid scores."""
    if opts.fc_norm:
        pooled = _norm("vit_fc_norm")(pooled)
    x = layers.Dense(opts.num_classes, name="head_dense")(pooled)
    outputs = layers.Activation("sigmoid", dtype="float32", name="output")(x)
    return keras.Model(image, outputs, name=name)


# --- the weight table ---

def norm_tensors(prefix, width):
    return {f"{prefix}.weight": (width,), f"{prefix}.bias": (width,)}


def _mlp_tensors(prefix, opts):
    return {f"{prefix}.fc1.weight": (opts.mlp_width, opts.width), f"{prefix}.fc1.bias": (opts.mlp_width,),
            f"{prefix}.fc2.weight": (opts.width, opts.mlp_width), f"{prefix}.fc2.bias": (opts.width,)}


def embedding_tensors(opts, position_table: bool = True) -> dict[str, tuple[int, ...]]:
    """The patch embedding, the prefix tokens and the position table (`embed`'s weights) in the checkpoint."""
    w = opts.width
    out = {"patch_embed.proj.weight": (w, 3, opts.patch, opts.patch), "patch_embed.proj.bias": (w,)}
    if position_table:
        out["pos_embed"] = (1, opts.table_length, w)
    if opts.class_token:
        out["cls_token"] = (1, 1, w)
    if opts.reg_tokens:
        out["reg_token"] = (1, opts.reg_tokens, w)
    return out


def embedding_weights(opts, t: dict, fold) -> dict[str, list[np.ndarray]]:
    """`embed`'s layers from the checkpoint; `fold(kernel, bias)` adapts the patch embedding."""
    out = {"vit_patch_embedding": list(fold(*patch_kernel(t)))}
    if "pos_embed" in t:
        out["vit_position_embedding"] = [t["pos_embed"].reshape(1, -1)]
    if opts.class_token:
        out["vit_class_token"] = [t["cls_token"].reshape(1, -1)]
    if opts.reg_tokens:
        out["vit_register_tokens"] = [t["reg_token"].reshape(1, -1)]
    return out


def expected_tensors(opts: ViTOptions, head: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, with its shape."""
    w = opts.width
    out = embedding_tensors(opts)
    for index in range(opts.depth):
        block = f"blocks.{index}"
        out.update(norm_tensors(f"{block}.norm1", w))
        out[f"{block}.attn.qkv.weight"] = (3 * w, w)
        if opts.qkv_bias:
            out[f"{block}.attn.qkv.bias"] = (3 * w,)
        out.update({f"{block}.attn.proj.weight": (w, w), f"{block}.attn.proj.bias": (w,)})
        out.update(norm_tensors(f"{block}.norm2", w))
        out.update(_mlp_tensors(f"{block}.mlp", opts))
        if opts.layer_scale:
            out.update({f"{block}.ls1.gamma": (w,), f"{block}.ls2.gamma": (w,)})
    out.update(norm_tensors("fc_norm" if opts.fc_norm else "norm", w))
    if opts.pool == "map":
        out.update({"attn_pool.latent": (1, 1, w), "attn_pool.q.weight": (w, w), "attn_pool.q.bias": (w,),
                    "attn_pool.kv.weight": (2 * w, w), "attn_pool.kv.bias": (2 * w,),
                    "attn_pool.proj.weight": (w, w), "attn_pool.proj.bias": (w,)})
        out.update(norm_tensors("attn_pool.norm", w))
        out.update(_mlp_tensors("attn_pool.mlp", opts))
    if head:
        out.update({"head.weight": (opts.num_classes, w), "head.bias": (opts.num_classes,)})
    return out


def norm_weights(t, prefix):
    return [t[f"{prefix}.weight"], t[f"{prefix}.bias"]]


def _dense(weight, bias, scale=None):
    kernel, bias = weight.T, bias
    if scale is not None:
        kernel, bias = kernel * scale, bias * scale
    return [kernel, bias]


def attention_weights(opts: ViTOptions, q, k, v, proj_weight, proj_bias, scale=None):
    """MultiHeadAttention's eight weights from torch (out, in) matrices: q/k/v as (w, b) pairs."""
    w, heads = opts.width, opts.heads
    out = []
    for weight, bias in (q, k, v):
        out += [weight.T.reshape(w, heads, w // heads), bias.reshape(heads, w // heads)]
    kernel, bias = _dense(proj_weight, proj_bias, scale)
    return out + [kernel.reshape(heads, w // heads, w), bias]


def trunk_weights(opts: ViTOptions, t: dict) -> dict[str, list[np.ndarray]]:
    """Layer name -> weights for the blocks and the final norm (the part the registry's ViT shares)."""
    w = opts.width
    out = {}
    for index in range(opts.depth):
        block, name = f"blocks.{index}", f"vit_block{index}"
        qkv = t[f"{block}.attn.qkv.weight"]
        qkv_bias = t.get(f"{block}.attn.qkv.bias", np.zeros(3 * w, np.float32))
        ls1 = t[f"{block}.ls1.gamma"] if opts.layer_scale else None
        ls2 = t[f"{block}.ls2.gamma"] if opts.layer_scale else None
        pieces = [(qkv[i * w:(i + 1) * w], qkv_bias[i * w:(i + 1) * w]) for i in range(3)]
        out[f"{name}_norm1"] = norm_weights(t, f"{block}.norm1")
        out[f"{name}_attention"] = attention_weights(opts, *pieces, t[f"{block}.attn.proj.weight"],
                                                     t[f"{block}.attn.proj.bias"], ls1)
        out[f"{name}_norm2"] = norm_weights(t, f"{block}.norm2")
        out[f"{name}_mlp1"] = _dense(t[f"{block}.mlp.fc1.weight"], t[f"{block}.mlp.fc1.bias"])
        out[f"{name}_mlp2"] = _dense(t[f"{block}.mlp.fc2.weight"], t[f"{block}.mlp.fc2.bias"], ls2)
    return out


def patch_kernel(t: dict) -> tuple[np.ndarray, np.ndarray]:
    return t["patch_embed.proj.weight"].transpose(2, 3, 1, 0), t["patch_embed.proj.bias"]


def layer_weights(opts: ViTOptions, t: dict, fold, name: str = "") -> dict[str, list[np.ndarray]]:
    """Layer name -> weights for the whole imported model; `fold(kernel, bias)` adapts the patch embedding."""
    w = opts.width
    out = embedding_weights(opts, t, fold)
    out.update(trunk_weights(opts, t))
    out["vit_fc_norm" if opts.fc_norm else "vit_norm"] = norm_weights(t, "fc_norm" if opts.fc_norm else "norm")
    if opts.pool == "map":
        kv, kv_bias = t["attn_pool.kv.weight"], t["attn_pool.kv.bias"]
        out["vit_map_latent"] = [t["attn_pool.latent"].reshape(1, -1)]
        out["vit_map_attention"] = attention_weights(
            opts, (t["attn_pool.q.weight"], t["attn_pool.q.bias"]), (kv[:w], kv_bias[:w]), (kv[w:], kv_bias[w:]),
            t["attn_pool.proj.weight"], t["attn_pool.proj.bias"])
        out["vit_map_norm"] = norm_weights(t, "attn_pool.norm")
        out["vit_map_mlp1"] = _dense(t["attn_pool.mlp.fc1.weight"], t["attn_pool.mlp.fc1.bias"])
        out["vit_map_mlp2"] = _dense(t["attn_pool.mlp.fc2.weight"], t["attn_pool.mlp.fc2.bias"])
    out["head_dense"] = _dense(t["head.weight"], t["head.bias"])
    return out
