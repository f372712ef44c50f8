"""Parameter counts of the ConvNeXt, EfficientNetV2 and ViT rows, computed without building them.

STANDARD LIBRARY ONLY, like models.table (preflight sizes a model before
TensorFlow starts). Each function mirrors, weight for weight, what its
builder creates; tests compare them with built models. Layer and batch
normalization have 2 trainable weights per channel; batch normalization
adds 2 non-trainable ones (moving mean and variance).
"""

from __future__ import annotations


class _Tally:
    def __init__(self):
        self.trainable = 0
        self.non_trainable = 0

    def conv(self, kernel: int, c_in: int, c_out: int, bias: bool, groups: int = 1) -> None:
        self.trainable += kernel * kernel * (c_in // groups) * c_out + (c_out if bias else 0)

    def dense(self, c_in: int, c_out: int, bias: bool = True) -> None:
        self.trainable += c_in * c_out + (c_out if bias else 0)

    def layer_norm(self, c: int) -> None:
        self.trainable += 2 * c

    def batch_norm(self, c: int) -> None:
        self.trainable += 2 * c
        self.non_trainable += 2 * c

    def pooled_head(self, c: int, n_tags: int) -> tuple[int, int]:
        self.dense(c, n_tags)
        return self.trainable, self.non_trainable


def convnext(name, architecture, input_shape, n_tags) -> tuple[int, int]:
    widths, t = architecture.widths, _Tally()
    t.conv(4, input_shape[2], widths[0], bias=True)  # stem: 4x4 patchify
    t.layer_norm(widths[0])
    for stage, (width, repeat) in enumerate(zip(widths, architecture.repeats)):
        if stage:
            t.layer_norm(widths[stage - 1])
            t.conv(2, widths[stage - 1], width, bias=True)
        for _ in range(repeat):
            t.conv(7, width, width, bias=True, groups=width)
            t.layer_norm(width)
            t.dense(width, 4 * width)
            t.dense(4 * width, width)
            t.trainable += width  # layer scale (a 1x1 depthwise conv here)
    t.layer_norm(widths[-1])  # include_top=False ends in a layer norm
    return t.pooled_head(widths[-1], n_tags)


def efficientnetv2(name, architecture, input_shape, n_tags) -> tuple[int, int]:
    from deepdanbooru.models.table import EFFICIENTNETV2_STAGES, EFFICIENTNETV2_TOP

    stem, stages = EFFICIENTNETV2_STAGES[name]
    t = _Tally()
    t.conv(3, input_shape[2], stem, bias=False)
    t.batch_norm(stem)
    c_in = stem
    for width, repeat, (kernel, expand, _, se_ratio, fused) in zip(architecture.widths, architecture.repeats, stages):
        for _ in range(repeat):
            inner = c_in * expand
            if expand != 1:
                t.conv(kernel if fused else 1, c_in, inner, bias=False)
                t.batch_norm(inner)
            if not fused:
                t.conv(kernel, inner, inner, bias=False, groups=inner)  # depthwise
                t.batch_norm(inner)
            if 0 < se_ratio <= 1:
                squeezed = max(1, int(c_in * se_ratio))
                t.conv(1, inner, squeezed, bias=True)
                t.conv(1, squeezed, inner, bias=True)
            t.conv(1 if expand != 1 or not fused else kernel, inner, width, bias=False)
            t.batch_norm(width)
            c_in = width
    t.conv(1, c_in, EFFICIENTNETV2_TOP, bias=False)
    t.batch_norm(EFFICIENTNETV2_TOP)
    return t.pooled_head(EFFICIENTNETV2_TOP, n_tags)


def vit(name, architecture, input_shape, n_tags) -> tuple[int, int]:
    height, width_px, channels = input_shape
    width, depth, patch = architecture.widths[0], architecture.repeats[0], architecture.patch
    tokens = (height // patch) * (width_px // patch)
    t = _Tally()
    t.conv(patch, channels, width, bias=True)
    t.trainable += tokens * width  # position embedding
    for _ in range(depth):
        t.layer_norm(width)
        t.trainable += 4 * (width * width + width)  # query, key, value, output projections
        t.layer_norm(width)
        t.dense(width, 4 * width)
        t.dense(4 * width, width)
    t.layer_norm(width)
    return t.pooled_head(width, n_tags)


COUNTERS = {"convnext": convnext, "efficientnetv2": efficientnetv2, "vit": vit}
