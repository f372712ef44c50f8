"""Parameter counts of every family, computed without building (the registry names each family's counter).

STANDARD LIBRARY ONLY, like models.table (preflight sizes a model before
TensorFlow starts). Each function mirrors, weight for weight, what its
builder creates; tests compare them with built models. Layer and batch
normalization have 2 trainable weights per channel; batch normalization
adds 2 non-trainable ones (moving mean and variance).
"""

from __future__ import annotations

from deepdanbooru.registry import POOL_SIZE

# The ResNets' stem conv and max-pool each halve; every stage after the first halves.
STEM_HALVINGS = 2


def _halve(size: int) -> int:
    # A stride-2 conv or pool with padding "same" gives ceil(size / 2).
    return -(-size // 2)


def final_feature_size(architecture, height: int, width: int) -> tuple[int, int]:
    """Spatial size of a ResNet trunk's last feature map for an input of height x width."""
    for _ in range(STEM_HALVINGS + len(architecture.widths) - 1):
        height, width = _halve(height), _halve(width)
    return height, width


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


def resnet(name, architecture, input_shape, n_tags) -> tuple[int, int]:
    """models.blocks: convolutions without bias, each followed by batch norm."""
    t = _Tally()

    def conv_bn(kernel, c_in, c_out):
        t.conv(kernel, c_in, c_out, bias=False)
        t.batch_norm(c_out)

    c_in = architecture.widths[0] // 4
    conv_bn(7, input_shape[2], c_in)
    for width, repeat in zip(architecture.widths, architecture.repeats):
        inner = width // 4
        for block in range(repeat + 1):
            conv_bn(1, c_in if block == 0 else width, inner)
            conv_bn(3, inner, inner)
            conv_bn(1, inner, width)
            if block == 0:
                conv_bn(1, c_in, width)  # the projection shortcut
        c_in = width
    if architecture.head == "dense":
        final_h, final_w = final_feature_size(architecture, input_shape[0], input_shape[1])
        t.dense(c_in * (final_h // POOL_SIZE) * (final_w // POOL_SIZE), n_tags)
    else:
        t.conv(1, c_in, n_tags, bias=False)
    return t.trainable, t.non_trainable


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
    stem, stages, top = architecture.stem, architecture.stages, architecture.top
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
    t.conv(1, c_in, top, bias=False)
    t.batch_norm(top)
    return t.pooled_head(top, n_tags)


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

