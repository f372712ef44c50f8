"""train-project: check everything cheap first, take the lock, then hand over to the slice loop.

Config, tags, records and the model/input check run before TensorFlow is
imported, so a typo in project.json is reported in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.dataset.records import Records, load_records
from deepdanbooru.dataset.trust import split_stats, trust_warning
from deepdanbooru.errors import ModelError, TrainingError, UserError, file_field
from deepdanbooru.models.table import check_head_bias_init, check_model_input
from deepdanbooru.project.config import ProjectConfig, load_config
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.resume import START_FILE, fine_tuned_network, has_checkpoint, recorded_start
from deepdanbooru.project.shards import ShardIndex, scoring_shards, training_shards
from deepdanbooru.project.tags import load_tags
from deepdanbooru.runstate.cluster import ClusterRole, DeviceChoice, cluster_role, parse_devices, prepare_tensorflow
from deepdanbooru.runstate.lock import TrainingLock
from deepdanbooru.training.budget import TimeBudget
from deepdanbooru.training.source import SourceModel, check_input_size, check_resumed_source, read_source_model


@dataclass(frozen=True)
class TrainingPlan:
    """Everything the loop needs, validated."""

    config: ProjectConfig
    paths: ProjectPaths
    tags: list[str]
    train: Records
    validation: Records
    source_model: Path | None = None
    # The vocabulary the source model was trained on, when known (--source-tags, or its thresholds.csv).
    source_tags: tuple[str, ...] | None = None
    source: SourceModel | None = None  # what --source-model is: a file or a checkpoint folder, its categories
    force_mixed_precision: bool = False
    devices: DeviceChoice = DeviceChoice()
    role: ClusterRole = ClusterRole()  # from TF_CONFIG; only the chief writes into the project
    trust_warning: str | None = None  # printed at start and end when the split cannot measure the model
    split_note: str | None = None  # why a run keeps its split by post id (scoring.split.split_for_run)
    time_budget: TimeBudget | None = None  # --time-limit, counted from plan_training
    shards: ShardIndex | None = None  # the packed pictures (deepdanbooru pack), when the project has them
    source_tags_file: Path | None = None  # --source-tags, kept with the source in checkpoints/start.json
    start_note: str | None = None  # a --source-model taken from checkpoints/start.json (training.source)
    split_changed: str | None = None  # the validation split changed since the checkpoint (scoring.split)


def plan_training(project_dir, source_model=None, force_mixed_precision: bool = False,
                  devices: str | None = None, source_tags=None, time_limit: float | None = None,
                  time_limit_text: str | None = None) -> TrainingPlan:
    from deepdanbooru.runstate.state import read_state_json
    from deepdanbooru.scoring.split import split_change, split_for_run

    # First: the limit counts the whole command, start-up included.
    budget = TimeBudget(time_limit, time_limit_text) if time_limit is not None else None
    role = cluster_role()
    device_choice = parse_devices(devices)
    paths = ProjectPaths(project_dir)
    config = load_config(paths.root)
    config.require_epoch_count(time_limit)
    tags = load_tags(paths.tags)
    database = config.require_database()
    known_tags = source = None
    # Resuming a --source-model run: its checkpoint's network trains (training.network), not `model`.
    resumed = fine_tuned_network(paths.checkpoints)
    check_resumed_source(resumed and resumed["source"], source_model, paths.checkpoints)
    start_note = None
    started = recorded_start(paths.checkpoints) if source_model is None and source_tags is None else None
    if started is not None:
        source_model, source_tags = started
        start_note = (f"notice: the run started from --source-model {source_model} stopped before its first "
                      f"checkpoint: this one starts from it again ({paths.checkpoints / START_FILE}; delete it to "
                      "train from scratch)")
    if source_model is None:
        if source_tags is not None:
            raise ModelError(file_field(source_tags, None, "--source-tags is for --source-model; give both"))
        if resumed is None:
            check_model_input(config.model, config.input_shape, source=config.config_path)
            check_head_bias_init(config.model, config.head_bias_init, config.config_path)
    else:
        try:
            source = read_source_model(source_model, source_tags)
            check_input_size(source, config)
        except UserError as error:
            if started is None:
                raise
            raise TrainingError(f"{error} (the source the stopped run started from, as "
                                f"{paths.checkpoints / START_FILE} records it; delete that file to train from "
                                "scratch)") from None
        source_model, known_tags = source.path, source.tags
    records = load_records(database, config.minimum_tag_count, config.image_extensions)
    if not len(records):
        raise TrainingError(file_field(
            database, "posts",
            f"no eligible records (file_ext in {', '.join(config.image_extensions)} and tag_count_general >= "
            f"{config.minimum_tag_count}); lower minimum_tag_count in {config.config_path} or fill the database"))
    shards = training_shards(paths.root, config, paths.tags, records)
    saved_state = read_state_json(paths.checkpoints)[0]
    train, validation, split_note = split_for_run(records, config.validation_fraction, config.seed, saved_state)
    split_changed = split_change(records, validation, config.validation_fraction, config.seed, saved_state,
                                 config.config_path) if has_checkpoint(paths.checkpoints) else None
    if not len(train):
        raise TrainingError(file_field(
            config.config_path, "validation_fraction",
            f"leaves no training records out of {len(records)} eligible; lower it"))
    stats = split_stats(itertools.chain(((False, t) for t in train.tag_strings),
                                        ((True, t) for t in validation.tag_strings)), tags)
    return TrainingPlan(config, paths, tags, train, validation, source_model, known_tags, source,
                        force_mixed_precision, device_choice, role, split_note=split_note, time_budget=budget,
                        shards=shards, start_note=start_note, split_changed=split_changed,
                        source_tags_file=Path(source_tags) if source_tags is not None else None,
                        trust_warning=trust_warning(stats, config.validation_fraction, config.config_path))


def build_monitors(plan: TrainingPlan, echo=print, stream=None) -> list:
    """The monitors of a normal run, in call order (a worker that is not the chief only prints).

    The best-model saver comes before the writers and the console so its note
    ("new best") reaches them in the same validation's logs. It is there even
    without validation: its (empty) state in every checkpoint lets a later run
    turn validation on and still resume.
    """
    from deepdanbooru.training.best import BestModelMonitor
    from deepdanbooru.training.history import HistoryMonitor
    from deepdanbooru.training.kept import KeptMonitor
    from deepdanbooru.training.monitors import default_monitors
    from deepdanbooru.training.tensorboard import TensorBoardMonitor

    bar, console = default_monitors(echo, stream)
    if not plan.role.is_chief:
        return [bar, console]
    config = plan.config
    # Its file is named once the network that trains is known (RunInfo.best_export).
    best = BestModelMonitor(None, config.best_model_metric, plan.tags,
                            mixed_precision=config.mixed_precision, echo=echo)
    # KeptMonitor after the console: its line follows the final figures it compares with the source's.
    return [bar, best, TensorBoardMonitor(plan.paths.logs, echo), HistoryMonitor(plan.paths.history, echo), console,
            KeptMonitor(plan.paths.logs, plan.tags, echo)]


def train_project(project_dir, source_model=None, force_mixed_precision: bool = False, echo=print,
                  monitors=None, devices: str | None = None, source_tags=None, time_limit: float | None = None,
                  time_limit_text: str | None = None):
    """Train (or resume) the project; returns the final counters (runstate.state.Counters).

    devices: "all" (default), "cpu" or GPU indices such as "0,1" (see training.strategy).
    time_limit: seconds; at the last slice end before it would be passed, export and return (see budget.py).
    """
    plan = plan_training(project_dir, source_model, force_mixed_precision, devices, source_tags, time_limit,
                         time_limit_text)
    if plan.start_note:
        echo(plan.start_note)
    if plan.split_note:
        echo(plan.split_note)
    if plan.split_changed and plan.role.is_chief:
        echo(plan.split_changed)
    if plan.shards is not None:
        echo(f"Pictures: packed, from {plan.shards.directory}")
        for warning in plan.shards.warnings():
            echo(f"warning: {warning}")
    if len(plan.validation) and plan.role.is_chief:
        packed, notice = scoring_shards(plan.paths.root, plan.config, plan.validation,
                                        (plan.config.image_height, plan.config.image_width))
        if packed is not None:
            echo(f"Validation pictures: packed, from {packed.directory}")
        elif notice:
            echo(notice)
    _warn_untrusted(plan, echo)
    # In a cluster only the chief locks and writes; the workers read the project and compute.
    with TrainingLock(plan.paths.lock, echo) if plan.role.is_chief else contextlib.nullcontext():
        # TensorFlow's C++ log would interleave our console with noise (a cuInit failure on every CPU-only
        # machine, a tf.data rewrite note per slice under op determinism); real failures still arrive as
        # Python exceptions. TF_CPP_MIN_LOG_LEVEL=0 shows everything.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        prepare_tensorflow(plan.role)
        from deepdanbooru.training.export import remove_partial_checkpoints, remove_partial_exports
        from deepdanbooru.training.loop import train
        from deepdanbooru.training.strategy import choose_strategy, cluster_failures

        if plan.role.is_chief:
            # Holding the lock, any partial export or checkpoint left here belongs to a dead run.
            remove_partial_exports(plan.paths.root)
            remove_partial_checkpoints(plan.paths.checkpoints)
        with cluster_failures(plan.role, plan.paths.checkpoints):
            if plan.role.in_cluster:
                echo(f"Cluster: {plan.role.describe()}; waiting until every task in TF_CONFIG has started")
            # Before the monitors create their variables: that starts TensorFlow's runtime, after which
            # collectives and logical devices can no longer be configured.
            strategy = choose_strategy(plan.devices, plan.role)
            # The console repeats the warning at the end, next to the final figures it is about.
            return train(plan, strategy, build_monitors(plan, echo) if monitors is None else monitors, echo)


def _warn_untrusted(plan: TrainingPlan, echo) -> None:
    if plan.trust_warning and plan.role.is_chief:
        echo(f"warning: {plan.trust_warning}")
