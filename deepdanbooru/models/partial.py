"""trainable_blocks: only the last N blocks (ViT) or stages (ResNet, ConvNeXt, EfficientNetV2, SwinV2) of the
trunk train, with the top layers and the head; the rest is frozen for the whole run.

Which layer belongs to which block is layer_decay's reading of the model's own layer names
(models.optimizers.trunk_units over the registry's ParameterGroups), so both keys count the same blocks on
every family, a --source-model's included. The stem (patch and position embeddings, the first
convolution) is below the first block: it trains only with trainable_blocks null. The top layers (final
norm, top convolution) sit between the last block and the head and train whenever a block does
(N >= 1); N = 0 trains the head alone.

A frozen layer follows Keras' rule (no gradients, batch normalization on its moving statistics). The
train step asks for gradients of the trainable variables only, so the frozen part's backward pass is
dead code that the compiled step never runs (bench/partial.py measures it), and the optimizer is built
for the trainable variables alone: no moments for the frozen ones.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.builder import parameter_count
from deepdanbooru.models.optimizers import trunk_units, unit_count

KEY = "trainable_blocks"


def _amount(count: int) -> str:
    if count >= 1_000_000:
        return f"{count / 1e6:.1f}M"
    return f"{count / 1e3:.1f}K" if count >= 1_000 else str(count)


@dataclass(frozen=True)
class PartialTraining:
    """What trainable_blocks leaves training: the last `blocks` of `count` units, `unit` naming them."""

    blocks: int
    count: int
    unit: str
    frozen: tuple  # the top-level layers frozen for the whole run
    trainable: int  # parameters that train
    total: int  # parameters that train with trainable_blocks null

    def describe(self) -> str:
        """`Trainable: last 2 of 12 blocks + head, 7.1M of 21.7M parameters (33%)`."""
        part = self.part()
        share = 100 * self.trainable / self.total if self.total else 100.0
        percent = f"{share:.0f}%" if share >= 1 else f"{share:.2g}%"
        return f"Trainable: {part}, {_amount(self.trainable)} of {_amount(self.total)} parameters ({percent})"

    def part(self) -> str:
        return "the head only" if self.blocks == 0 else f"last {self.blocks} of {self.count} {self.unit}s + head"

    def freeze(self) -> None:
        for layer in self.frozen:
            layer.trainable = False

    @contextlib.contextmanager
    def thawed(self):
        """The frozen layers trainable while inside, so a record of the architecture (which keeps each
        layer's trainable flag) describes the network itself, not this run's choice."""
        for layer in self.frozen:
            layer.trainable = True
        try:
            yield
        finally:
            self.freeze()


def partial_training(model, name: str, blocks: int | None, source=None,
                     network: str | None = None) -> PartialTraining | None:
    """What trainable_blocks `blocks` freezes in `model` (None: nothing, every layer trains).

    `name`: project.json's model, whose family's layer names are tried first; `network`: what the model is in
    messages (default `name`); `source`: the file whose trainable_blocks field is named. A model whose blocks
    cannot be told apart, or a `blocks` above its count, is a ModelError.
    """
    if blocks is None:
        return None
    groups, units = trunk_units(model, name, KEY, source, network)
    count = unit_count(units)
    if blocks > count:
        message = (f"is {blocks}, but {network or name} has {count} {groups.unit}s; give 0 to {count} "
                   f"(0: the head only), or null to train every layer")
        raise ModelError(file_field(source, KEY, message) if source else f"{KEY}: {message}")
    first = count - blocks  # the first unit that trains
    frozen = tuple(layer for layer, unit in units
                   if (unit is None and blocks == 0) or (unit is not None and unit < first))
    total = parameter_count(model.trainable_weights)
    return PartialTraining(blocks, count, groups.unit, frozen,
                           total - sum(parameter_count(layer.trainable_weights) for layer in frozen), total)
