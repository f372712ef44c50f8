"""The network a run trains, as every checkpoint records it: its name, its source and its architecture.

A --source-model run trains the source's network, not project.json's `model`. Each checkpoint holds,
next to the weights, the source it started from (its path as given, made absolute) and the network's
Keras architecture (`model.to_json()`, the vocabulary already grown onto tags.txt), so a resumed run
rebuilds the same network from the checkpoint alone: --source-model may be left out, and the source's
files are not read again. The same --source-model may be given again; another one is refused.

A run without a source records its `model` name and an empty source and architecture; its network is
rebuilt from the model table as before. Checkpoints written before the record existed read as no record.

The record also holds the name the run's exports carry (project.paths: `model` from the table, the
network's own name from a source), so a resumed run keeps writing under the name it started with; a
checkpoint written before that existed reads as "", and its run keeps `model`, as its exports are named.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf

from deepdanbooru.models.builder import count_weights
from deepdanbooru.models.precision import with_policy
from deepdanbooru.project.paths import safe_export_name
from deepdanbooru.project.resume import source_path
from deepdanbooru.training.source import check_resumed_source


@dataclass(frozen=True)
class Network:
    """What trains: `name` (the Keras model's name, which every export keeps), the --source-model it came
    from ("" for the model table), its architecture (JSON; "" for the model table) and parameter counts."""

    name: str
    source: str = ""
    architecture: str = ""
    trainable: int = 0
    non_trainable: int = 0
    exports: str = ""  # the name in model-<exports>.keras ("": recorded before the name was)

    @classmethod
    def of(cls, model: keras.Model, source, exports: str) -> "Network":
        trainable, non_trainable = count_weights(model)
        source = str(source_path(source)) if source else ""
        return cls(model.name, source, model.to_json() if source else "", trainable, non_trainable, exports)

    def build(self, policy: str) -> keras.Model:
        """The recorded architecture under `policy`, its weights still to be restored from the checkpoint."""
        return with_policy(keras.models.model_from_json(self.architecture), policy)

    def mirror(self) -> dict:
        """The keys checkpoints/state.json gives preflight (which must not start TensorFlow)."""
        return {"network": self.name, "source": self.source or None, "exports": self.exports,
                "parameters": {"trainable": self.trainable, "non_trainable": self.non_trainable}}


class NetworkState(tf.Module):
    """The record's tf.Variables in a checkpoint (create outside any strategy scope, as training.state's)."""

    def __init__(self, network: Network | None = None):
        super().__init__(name="network")
        network = network or Network("")
        self.network_name = tf.Variable(network.name, dtype=tf.string, trainable=False, name="name")
        self.source = tf.Variable(network.source, dtype=tf.string, trainable=False, name="source")
        self.architecture = tf.Variable(network.architecture, dtype=tf.string, trainable=False, name="architecture")
        self.exports = tf.Variable(network.exports, dtype=tf.string, trainable=False, name="exports")

    def network(self) -> Network:
        name, source, architecture, exports = (variable.numpy().decode("utf-8") for variable in (
            self.network_name, self.source, self.architecture, self.exports))
        return Network(name, source, architecture, exports=exports)


def export_name(config_model: str, model: keras.Model, source, checkpoint: str | None) -> str:
    """The name the run's exports carry (project.paths): the one `checkpoint` records when resuming (`config_model`
    for a checkpoint written before the record); else the network's own name when it comes from `source`."""
    if checkpoint:
        state = NetworkState()
        tf.train.Checkpoint(network=state).read(checkpoint).expect_partial()
        return state.network().exports or config_model
    return (safe_export_name(model.name) or config_model) if source else config_model


def recorded_network(checkpoint: str | None, source_model, checkpoints) -> Network | None:
    """The source network a checkpoint was trained as, or None (no checkpoint, no source, or written before
    checkpoints recorded it); a --source-model other than the recorded one is refused in one line."""
    if not checkpoint:
        return None
    state = NetworkState()
    tf.train.Checkpoint(network=state).read(checkpoint).expect_partial()
    recorded = state.network()
    if not (recorded.source and recorded.architecture):
        return None
    check_resumed_source(recorded.source, source_model, checkpoints)
    return recorded
