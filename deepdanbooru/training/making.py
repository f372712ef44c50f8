"""Making the model a run trains: build it from the table or load a source, grow its vocabulary, set priors.

One entry, `make_model`, called inside the strategy scope before the checkpoint is restored. The
kinds of start, each one branch of `_start`:
- no --source-model: `build_model` from the table, then `backbone_weights` into the trunk (a fresh
  run only: a resumed run takes every weight from its checkpoint), then `head_bias_init`;
- --source-model FILE: a whole model (ours, import-model's, or DeepDanbooru's .keras / .h5), its
  vocabulary mapped onto tags.txt by name when the two differ (`grow`);
- --source-model FOLDER: a timm checkpoint (a WD v3 tagger) imported as import-model does, then grown
  the same way;
- resuming a checkpoint of a --source-model run: the network it records (training.network), with or
  without --source-model, the source's files not read again.
With a source that records categories (selected_tags.csv, import-model's categories.json) and a
project without categories.json, the chief writes one for the tags they share (training.source), once
the source is loaded and layer_decay has placed its layers: a refused source writes nothing.
The head (per-tag layer) is models.head's one definition in every branch.
"""

from __future__ import annotations

import keras

from deepdanbooru.captions import tag_key
from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.models import build_model, load_model_file
from deepdanbooru.models.backbone import load_backbone_weights
from deepdanbooru.models.head import grow_vocabulary, set_head_bias
from deepdanbooru.models.optimizers import layer_rate_factors
from deepdanbooru.models.partial import partial_training
from deepdanbooru.models.precision import global_policy, with_policy
from deepdanbooru.project.tags import tag_counts
from deepdanbooru.training.network import Network
from deepdanbooru.training.priors import log_frequency_weights, log_odds
from deepdanbooru.training.source import carry_categories, in_project_spelling


class Priors:
    """Per-tag counts over the training records, counted once and only when a key needs them."""

    def __init__(self, plan):
        self.plan = plan
        self._counts = None

    @property
    def counts(self) -> list[int]:
        if self._counts is None:
            self._counts = tag_counts(self.plan.train.tag_strings, self.plan.tags)
        return self._counts

    def log_odds(self) -> list[float]:
        return log_odds(self.counts, len(self.plan.train))

    def loss_weights(self) -> list[float] | None:
        if self.plan.config.tag_loss_weights is None:
            return None
        return log_frequency_weights(self.counts, len(self.plan.train))


def vocabulary_report_path(plan):
    return plan.paths.logs / "vocabulary.txt"


def make_model(plan, policy: str, priors: Priors, resuming: bool, echo=print, write_report: bool = True,
               recorded: Network | None = None):
    """The model to train under `policy`, uncompiled, its output one unit per tag of tags.txt.

    Call inside the strategy scope: every variable must be created there. `write_report`: the chief
    writes logs/vocabulary.txt when a source's vocabulary is grown (the other workers only print).
    `recorded`: the source network the checkpoint being resumed holds (training.network).
    """
    if recorded is not None:
        model = recorded.build(policy)
        echo(f"Network: {recorded.name}, fine-tuned from --source-model {recorded.source}: rebuilt from the "
             "checkpoint (the source's files are not read again)")
    else:
        model = _start(plan, policy, priors, resuming, echo, write_report)
    _check_model_shapes(model, plan, plan.source_model or (recorded and recorded.source) or plan.config.config_path)
    return model


def _start(plan, policy, priors, resuming, echo, write_report) -> keras.Model:
    config = plan.config
    if plan.source_model is None:
        with global_policy(policy):
            model = build_model(config.model, config.input_shape, len(plan.tags), seed=config.seed)
        if config.backbone_weights is not None and not resuming:
            count = load_backbone_weights(model, config.model, config.require_backbone_weights(), config.input_shape)
            echo(f"Backbone: {count} trunk layers from {config.backbone_weights}; the head starts fresh")
        if config.head_bias_init == "log_prior":
            set_head_bias(model, priors.log_odds())
        return model
    if config.backbone_weights is not None and not resuming:
        echo(f"notice: --source-model gives every weight; backbone_weights of {config.config_path} is not used")
    if plan.source is not None and plan.source.folder:
        from deepdanbooru.models.timm.checkpoint import import_checkpoint

        size = (config.image_height, config.image_width)
        imported = import_checkpoint(plan.source_model, input_size=size if config.resample_positions else None)
        echo(f"--source-model {plan.source_model.name}: {imported.model.name}; channel order the "
             f"weights expect: {imported.channel_order_reason}")
        if imported.source.input_size != size:
            height, width = imported.source.input_size
            echo(f"--source-model {plan.source_model.name}: position table resampled from {width}x{height} to "
                 f"{size[1]}x{size[0]} (resample_positions)")
        loaded = imported.model
    else:
        # Loaded outside our control (maybe compiled, maybe another policy): rebuilt uncompiled under ours.
        loaded = load_model_file(plan.source_model)
    # Every check of the source before the first file it leads to is written (categories.json, the report).
    network = network_label(plan, None, loaded)
    layer_rate_factors(loaded, config.model, config.layer_decay, config.config_path, network=network)
    partial_training(loaded, config.model, config.trainable_blocks, config.config_path, network=network)
    if plan.source is not None and write_report:
        carry_categories(plan, echo)
    return with_policy(grow(loaded, plan, priors, echo, write_report), policy)


def network_label(plan, recorded: Network | None, model) -> str:
    """What the model that trains is, in messages about its layers: project.json's model, or its source."""
    source = plan.source_model.name if plan.source_model is not None else recorded and recorded.source
    return f"--source-model {source} ({model.name})" if source else plan.config.model


def grow(model, plan, priors, echo=print, write_report: bool = True):
    """`model` with its head mapped onto tags.txt by name, when the source's vocabulary is known and differs."""
    if plan.source_tags is None:
        return model
    # By name whatever the spelling: a source's 'long hair' is tags.txt's long_hair.
    source_tags = in_project_spelling(plan.source_tags, plan.tags)
    if list(source_tags) == list(plan.tags):
        return model
    grown, summary = grow_vocabulary(model, source_tags, plan.tags, priors.log_odds(), plan.source_model)
    report = vocabulary_report_path(plan)
    if write_report:
        report.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(report, vocabulary_report(plan.source_tags, plan.tags, plan.source_model))
    echo(f"--source-model {plan.source_model.name}: kept {summary['kept']:,} tags, {summary['new']:,} new, "
         f"{summary['dropped']:,} dropped (listed in {report}); new tags start at their frequency's prior")
    return grown


def vocabulary_report(source_tags, tags, source) -> str:
    """One `kept|new|dropped<TAB>tag` line per tag: tags.txt's order, then the dropped ones in the source's;
    a kept tag the source spells otherwise has that spelling in a third column."""
    ours = {tag_key(tag) for tag in tags}
    theirs = {tag_key(tag): tag for tag in source_tags}
    lines = [f"# {source}: the source model's vocabulary mapped onto tags.txt by name"]
    for tag in tags:
        spelling = theirs.get(tag_key(tag))
        line = f"new\t{tag}" if spelling is None else f"kept\t{tag}"
        lines.append(line if spelling in (None, tag) else f"{line}\t{spelling}")
    lines += [f"dropped\t{tag}" for tag in source_tags if tag_key(tag) not in ours]
    return "\n".join(lines) + "\n"


def _check_model_shapes(model, plan, source) -> None:
    expected_input = (None, *plan.config.input_shape)
    if tuple(model.input_shape) != expected_input:
        height, width = tuple(model.input_shape)[1:3]
        raise ModelError(file_field(source, "input", f"model input is {tuple(model.input_shape)[1:]}, but "
                                    f"{plan.config.config_path} asks for (height, width, 3) = "
                                    f"{plan.config.input_shape}; set image_width {width} and image_height {height}"))
    output = tuple(model.output_shape)
    if len(output) != 2 or output[1] != len(plan.tags):
        raise ModelError(file_field(source, "output", f"model output is {output[1:]}, but {plan.paths.tags} "
                                    f"has {len(plan.tags)} tags; give --source-tags (the tags.txt the model was "
                                    "trained with) to map its outputs onto these tags by name"))
