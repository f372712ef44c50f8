"""freeze_backbone_epochs: the trunk frozen for the first epochs, then the whole model trains.

Which layers freeze is models.head's one definition of the head: everything
with weights but the per-tag layer, on every model family and on DeepDanbooru
files whose layers Keras numbered. A layer built non-trainable (a constant
stored as weights, such as an imported SwinV2's shift masks) is never unfrozen.

Where the trunk unfreezes, the optimizer starts afresh: its step count and
every moment go back to zero, as recompiling does in Keras's transfer-learning
guide. Kept, Adam's step count would have run on through the frozen epochs
while the trunk's moments stayed zero, and bias correction would then step
the trunk at several times the learning rate for hundreds of steps, exactly
where the pretrained weights most need a gentle start. The reset is a
function of (used_epoch, offset) alone, so a resumed run resets at the same
step as the run that never stopped.
"""

from __future__ import annotations

from deepdanbooru.models.backbone import freezable_layers, set_backbone_trainable


def reset_optimizer_state(optimizer) -> None:
    """Put `optimizer` (an inner optimizer, not a loss-scale wrapper) where a fresh one stands: step count
    and slot variables zero. The learning rate is the schedule's, so it stays."""
    keep = {id(optimizer.learning_rate)}
    for variable in optimizer.variables:
        if id(variable) not in keep:
            variable.assign(variable.numpy() * 0)


class BackboneFreeze:
    """Sets the trunk's trainable flag at each epoch start and restarts the optimizer where it unfreezes."""

    def __init__(self, model, optimizer, epochs: int, on_change=None, echo=print, trains: str = "every layer"):
        """`model` as built, before any freeze but trainable_blocks' for the whole run: its trainable trunk
        layers are the ones frozen and unfrozen. `trains`: what trains once they are unfrozen."""
        self.layers = freezable_layers(model)
        self.trains = trains
        self.optimizer = optimizer  # the inner optimizer, whose state the checkpoint holds
        self.epochs = int(epochs)
        self.on_change = on_change  # called when the trainable variables changed (the step must trace again)
        self.echo = echo

    def frozen(self, used_epoch: int) -> bool:
        return used_epoch < self.epochs

    def at_epoch(self, used_epoch: int, offset: int) -> None:
        """Call before training at (used_epoch, offset), at every epoch start and after a resume."""
        frozen = self.frozen(used_epoch)
        if set_backbone_trainable(self.layers, not frozen):
            if self.on_change is not None:
                self.on_change()
            self.echo(f"Backbone frozen for epochs 1 to {self.epochs}: only the head trains" if frozen
                      else f"Backbone unfrozen from epoch {used_epoch + 1}: {self.trains} trains")
        # offset 0: no step of this epoch was taken, so none was checkpointed with the fresh state yet. Without a
        # trunk to unfreeze (trainable_blocks 0 leaves only the head) nothing changes there, so neither does the
        # optimizer.
        if self.epochs and self.layers and used_epoch == self.epochs and offset == 0:
            reset_optimizer_state(self.optimizer)
            self.echo(f"Optimizer state restarted for the unfrozen trunk (epoch {used_epoch + 1})")
