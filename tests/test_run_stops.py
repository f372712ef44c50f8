"""A run's stops are in its history and on its report: Ctrl-C, the time limit and a kill, each resumed."""

import re

import pytest
from train_helpers import make_project

from deepdanbooru.errors import Interrupted
from deepdanbooru.report import summary
from deepdanbooru.report.charts import run_charts
from deepdanbooru.report.runfiles import read_run_files


def ctrl_c_at(step):
    """A monitor that presses Ctrl-C (a KeyboardInterrupt, as the terminal's SIGINT raises it) after a step's line."""
    from deepdanbooru.training.monitors import Monitor

    class CtrlC(Monitor):
        def on_step_log(self, log):
            if log.progress.used_minibatch == step:
                raise KeyboardInterrupt

    return CtrlC()


@pytest.mark.slow
def test_ctrl_c_and_the_time_limit_are_recorded_and_reported(tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.loop import SliceTrainer
    from deepdanbooru.training.train import build_monitors, plan_training, train_project

    # 24 records, batch 4, checkpoints every 2 steps: at steps 2, 4 and 6, the end of the one epoch.
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1)
    monitors = build_monitors(plan_training(project), echo=lambda *_: None) + [ctrl_c_at(3)]
    with pytest.raises(Interrupted):
        train_project(project, echo=lambda *_: None, monitors=monitors)
    with monkeypatch.context() as patched:  # the time limit comes before the slice that starts at step 4
        fits = SliceTrainer._another_slice_fits
        patched.setattr(SliceTrainer, "_another_slice_fits",
                        lambda self: self.counters.used_minibatch < 4 and fits(self))
        lines = []
        train_project(project, echo=lines.append, time_limit=3600.0)
        assert lines[-1].startswith("Stopped for the time limit")
    train_project(project, echo=lambda *_: None)

    history = read_history(project / "logs" / "history.jsonl")
    marks = [(r["kind"], r["used_minibatch"], r.get("stopped_by") or r.get("reason")) for r in history
             if r["kind"] in ("stop", "resume")]
    assert marks == [("resume", 2, "Ctrl-C"), ("stop", 4, "time limit"), ("resume", 4, "time limit")]
    first = next(r for r in history if r["kind"] == "resume")
    assert (first["stopped_step"], first["repeated_steps"]) == (3, 1)
    trained = [r["used_minibatch"] for r in history if r["kind"] == "train"]
    assert trained == list(range(1, 7))  # each step once, in order

    files = read_run_files(project, "resnet_small")
    stops = summary.stops(files.history)
    assert [(stop.step, stop.reason) for stop in stops] == [(2, "Ctrl-C"), (4, "time limit")]
    from deepdanbooru.project.config import load_config

    rows = dict(summary.run_rows(load_config(project), files, "the project's final export",
                                 project / "model-resnet_small.keras", {"train": 24, "validation": 0, "tags": 5}))
    assert re.fullmatch(r"2: Ctrl-C at step 3, resumed from the checkpoint at step 2 after \d+:\d\d \(1 step trained "
                        r"again\); the time limit at step 4, resumed from the checkpoint at step 4 after \d+:\d\d",
                        rows["Stops"]), rows["Stops"]
    # The curves mark both, named.
    pytest.importorskip("matplotlib")
    charts = run_charts(files.train_rows, files.validation_rows, [(stop.step, stop.label) for stop in stops])
    for name in ("loss", "learning_rate"):
        assert ">Ctrl-C<" in charts[name] and ">time limit<" in charts[name]
