"""Console lines and the terminal-only progress bar."""

import io
from pathlib import Path

from deepdanbooru.training.monitors import (
    BadImages,
    ConsoleMonitor,
    Progress,
    ProgressBarMonitor,
    RunInfo,
    StepLog,
    default_monitors,
    format_duration,
)


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _run(resumed=None, start=None):
    start = start or Progress(0, 0, 0, 0, 0, epoch_count=2, train_records=100)
    return RunInfo(project=Path("p"), model_name="resnet_small", input_shape=(32, 48, 3), batch_size=4,
                   epoch_count=2, train_records=100, validation_records=5, slice_records=40, slices_per_epoch=3,
                   policy="float32", resumed_from=resumed, start=start)


def test_console_lines():
    lines = []
    console = ConsoleMonitor(lines.append)
    console.on_train_begin(_run())
    for expected in ["Records: 100 training, 5 validation",
                     "Model: resnet_small, input 32x48, batch 4, float32",
                     "Slices: 3 per epoch of up to 40 records, 2 epoch(s)"]:
        assert expected in lines
    assert lines[-1] == "Starting fresh (no checkpoint)"
    lines.clear()
    console.on_train_begin(_run("p/checkpoints/ckpt-3", Progress(1, 30, 118, 20, 1, 2, 100)))
    assert lines[-1] == ("Resuming from p/checkpoints/ckpt-3: used_epoch=1 used_minibatch=30 used_sample=118 "
                         "offset=20 random_seed=1 (1 of 2 epoch(s) done, 20 of 100 records into epoch 2)")
    lines.clear()
    console.on_train_begin(_run("p/checkpoints/ckpt-3", Progress(0, 25, 100, 100, 0, 2, 100)))
    assert lines[-1] == ("Resuming from p/checkpoints/ckpt-3: used_epoch=1 used_minibatch=25 used_sample=100 "
                         "offset=0 random_seed=1 (1 of 2 epoch(s) done)")
    progress = Progress(1, 40, 158, 40, 1, 2, 100)
    console.on_step_log(StepLog(progress, loss=0.25, precision=0.5, recall=0.25, f1=1 / 3,
                                samples_per_second=12.34, eta_seconds=3725, fraction=progress.fraction(60)))
    assert lines[-1] == ("epoch 2/2 step 40: loss 0.2500 precision 0.500 recall 0.250 f1 0.333 "
                         "12.3 samples/s 80.0% ETA 1:02:05")
    console.on_slice_end(progress, "p/checkpoints/ckpt-4", {"checkpoint_seconds": 1.234})
    assert lines[-1] == "Checkpoint p/checkpoints/ckpt-4 (epoch 2, offset 40/100, 1.23 s)"


def test_progress_fraction_and_durations():
    progress = Progress(used_epoch=1, used_minibatch=0, used_sample=0, offset=25, random_seed=1, epoch_count=4,
                        train_records=100)
    assert progress.fraction() == 0.3125
    assert progress.fraction(50) == 0.375
    assert format_duration(59.6) == "1:00" and format_duration(None) == "?" and format_duration(7322) == "2:02:02"


def test_progress_bar_only_on_a_terminal():
    plain = io.StringIO()
    bar = ProgressBarMonitor(plain)
    bar.on_train_begin(_run())
    bar.on_step(Progress(0, 1, 4, 0, 0, 2, 100), 4)
    assert plain.getvalue() == ""

    terminal = Terminal()
    bar = ProgressBarMonitor(terminal)
    bar.on_train_begin(_run())
    bar.on_step(Progress(0, 1, 4, 0, 0, 2, 100), 50)
    assert terminal.getvalue().startswith("\r[" + "#" * 7 + "-" * 23 + "]  25.0% epoch 1/2 record 50/100")
    bar.on_step(Progress(0, 2, 8, 0, 0, 2, 100), 54)  # within the redraw interval: nothing new
    drawn = terminal.getvalue()
    bar.on_slice_end(Progress(0, 2, 8, 40, 0, 2, 100), "ckpt-1", {})
    assert terminal.getvalue() == drawn + "\r\x1b[K"  # cleared before the console prints its line


def test_default_order_puts_the_bar_first():
    monitors = default_monitors(echo=lambda *_: None, stream=io.StringIO())
    assert [type(m) for m in monitors] == [ProgressBarMonitor, ConsoleMonitor]


def test_bad_pictures_of_a_slice_make_one_console_line_naming_the_first_few():
    lines = []
    console = ConsoleMonitor(lines.append)
    log = Path("p/logs/bad_images.txt")
    entries = [(position, f"img/{position}.jpg", "truncated: jpeg of 9 bytes ends early") for position in range(40, 50)]
    console.on_bad_images(BadImages(2, 40, 79, 10, entries, log))
    assert lines == ["warning: 10 pictures of records 40..79 in epoch 2 could not be read and were skipped: "
                     "img/40.jpg (truncated), img/41.jpg (truncated), img/42.jpg (truncated), and 7 more; "
                     "p/logs/bad_images.txt lists them with the reasons"]
    # A worker that does not write the log knows only the count.
    console.on_bad_images(BadImages(1, 0, 39, 1, [], log))
    assert lines[-1] == ("warning: 1 picture of records 0..39 in epoch 1 could not be read and was skipped; "
                         "p/logs/bad_images.txt lists it with the reasons")
    terminal = Terminal()
    bar = ProgressBarMonitor(terminal)
    bar.on_train_begin(_run())
    bar.on_step(Progress(0, 1, 4, 0, 0, 2, 100), 50)
    drawn = terminal.getvalue()
    bar.on_bad_images(BadImages(1, 0, 39, 1, [], log))
    assert terminal.getvalue() == drawn + "\r\x1b[K"
