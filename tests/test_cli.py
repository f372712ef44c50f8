import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from deepdanbooru import __version__
from deepdanbooru.cli import main


def run_cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_version_and_help():
    assert __version__ in run_cli("--version").output
    result = run_cli("--help")
    assert result.exit_code == 0 and "create-project" in result.output


def test_help_shows_whole_summaries_and_unknown_commands_get_a_suggestion():
    output = run_cli("--help").output
    assert "..." not in output.split("Commands:")[1]
    assert "Explain each predicted tag of TARGET (an image or a\n" in output  # wrapped, not cut
    result = CliRunner().invoke(main, ["train"])
    assert result.exit_code == 2
    assert "No such command 'train'. Did you mean 'train-project'?" in result.output
    assert "Did you mean 'evaluate' or 'evaluate-project'?" in CliRunner().invoke(main, ["evalute"]).output


def test_usage_errors_are_one_line_that_says_where_the_options_are():
    for args, line in (
            (["audit", "p", "--top", "0"],
             "error: Invalid value for '--top': 0 is not in the range x>=1 (main audit --help lists the options)"),
            (["evaluate"], "error: Missing argument 'TARGETS...' (main evaluate --help lists the options)"),
            (["train"], "error: No such command 'train'. Did you mean 'train-project'? (main --help lists the "
                        "commands)"),
            (["--bogus"], "error: No such option '--bogus' (main --help lists the options)"),
            # nan passes every range comparison: with it conv2tflite's check could never fail.
            (["conv2tflite", "--project-path", "p", "--save-path", "m.tflite", "--tolerance", "nan"],
             "error: Invalid value for '--tolerance': 'nan' is not a finite number (main conv2tflite --help lists "
             "the options)"),
            (["grad-cam", "p", "x.png", "--threshold", "inf"],
             "error: Invalid value for '--threshold': inf is not in the range 0.0<=x<=1.0 (main grad-cam --help "
             "lists the options)")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and result.output.splitlines() == [line], result.output


def test_create_project_writes_defaults_and_refuses_overwrite(tmp_path):
    project = tmp_path / "p"
    result = run_cli("create-project", str(project))
    assert result.exit_code == 0
    steps = result.output.split("Next steps:\n")[1].splitlines()
    assert [step.split()[:3] for step in steps] == [
        ["1.", "set", "database_path"], ["2.", "deepdanbooru", "make-tags"], ["3.", "deepdanbooru", "preflight"],
        ["4.", "deepdanbooru", "train-project"]]
    data = json.loads((project / "project.json").read_text())
    assert data["model"] == "resnet_custom_v2" and data["validation_fraction"] == 0.05
    (project / "project.json").write_text('{"model": "resnet_small"}')
    result = CliRunner().invoke(main, ["create-project", str(project)])
    assert result.exit_code == 2
    assert "already exists; use --overwrite" in result.output
    assert json.loads((project / "project.json").read_text()) == {"model": "resnet_small"}
    assert run_cli("create-project", "--overwrite", str(project)).exit_code == 0
    assert json.loads((project / "project.json").read_text())["model"] == "resnet_custom_v2"


def test_create_project_overwrite_keeps_the_project_json_a_model_was_trained_with(tmp_path):
    project = tmp_path / "p"
    assert run_cli("create-project", str(project)).exit_code == 0
    assert run_cli("create-project", "--overwrite", str(project)).exit_code == 0  # nothing trained: no copy
    assert [p.name for p in project.iterdir()] == ["project.json"]
    (project / "project.json").write_text('{"model": "resnet_small", "image_width": 64}')
    (project / "model-resnet_small.keras").write_bytes(b"trained")
    result = run_cli("create-project", "--overwrite", str(project))
    assert result.exit_code == 0
    (kept,) = project.glob("project.replaced-*.json")
    assert kept.read_text() == '{"model": "resnet_small", "image_width": 64}'
    assert f"Kept the previous project.json as {kept}: " in result.output
    assert json.loads((project / "project.json").read_text())["model"] == "resnet_custom_v2"


def test_user_error_is_one_line_without_traceback_unless_debug(tmp_path):
    (tmp_path / "project.json").write_text("{}")
    command = [sys.executable, "-m", "deepdanbooru", "create-project", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    expected = f"error: {tmp_path / 'project.json'}: already exists; use --overwrite to replace it"
    assert result.stderr.strip().splitlines() == [expected]
    debug = subprocess.run([sys.executable, "-m", "deepdanbooru", "--debug", *command[3:]], capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_what_the_file_system_refuses_is_one_line_naming_the_path_unless_debug(tmp_path):
    # A project folder asked for inside a file: the operating system's refusal, not a traceback.
    (tmp_path / "afile").write_text("")
    command = [sys.executable, "-m", "deepdanbooru", "create-project", str(tmp_path / "afile" / "p")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {tmp_path / 'afile' / 'p'}: Not a directory"]
    debug = subprocess.run([sys.executable, "-m", "deepdanbooru", "--debug", *command[3:]], capture_output=True, text=True)
    assert debug.returncode == 1 and "NotADirectoryError" in debug.stderr


def test_system_and_memory_errors_read_as_one_line():
    from deepdanbooru.errors import out_of_memory_line, system_error_line

    assert system_error_line(PermissionError(13, "Permission denied", "p/shards")) == "p/shards: Permission denied"
    assert system_error_line(PermissionError(1, "Operation not permitted", "a", None, "b")) == \
        "a -> b: Operation not permitted"
    assert system_error_line(OSError("socket closed")) == "socket closed"
    assert out_of_memory_line(ValueError("OOM")) is None
    import tensorflow as tf

    with pytest.raises(tf.errors.ResourceExhaustedError) as raised:
        tf.zeros([100_000_000, 30_720])
    line = out_of_memory_line(raised.value)
    assert line.startswith("out of memory (OOM when allocating tensor with shape[100000000,30720] and type float")
    assert line.endswith("); use a smaller batch (--batch-size, or minibatch_size in project.json) or image size")
    assert "\n" not in line and "{{" not in line


def test_help_and_create_project_do_not_import_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from deepdanbooru.cli import main\n"
        "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output\n"
        f"r = CliRunner().invoke(main, ['create-project', {str(tmp_path / 'p')!r}]); assert r.exit_code == 0, r.output\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


_ENTRY = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('interpreter shutdown ran', file=sys.stderr))\n"
    "sys.argv = ['deepdanbooru', *sys.argv[1:]]\n"
    "from deepdanbooru.cli import run\n"
    "run()\n"
)


def _entry(*args):
    return subprocess.run([sys.executable, "-c", _ENTRY, *args], capture_output=True, text=True)


@pytest.mark.slow
def test_entry_point_skips_the_interpreter_shutdown_after_tensorflow_with_output_flushed(tmp_path):
    shown = _entry("show-model", "resnet_small", "--width", "32", "--height", "32", "--tags", "3", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["output_shape"][-1] == 3  # all of it arrived through the pipe
    assert "interpreter shutdown ran" not in shown.stderr
    # TensorFlow's load-time absl lines (printed here whatever TF_CPP_MIN_LOG_LEVEL says) are filtered out.
    assert "absl::InitializeLog" not in shown.stderr and "] oneDNN" not in shown.stderr, shown.stderr
    junk = tmp_path / "junk.keras"
    junk.write_text("not a model")
    (tmp_path / "tags.txt").write_text("a\nb\n")
    refused = _entry("evaluate", "--model-path", str(junk), "--tags-path", str(tmp_path / "tags.txt"), str(junk))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(f"error: {junk}: cannot be opened as a Keras model")
    assert "interpreter shutdown ran" not in refused.stderr
    # Without TensorFlow loaded the ordinary exit stays, with its exit code.
    created = _entry("create-project", str(tmp_path / "p"))
    assert created.returncode == 0 and "interpreter shutdown ran" in created.stderr
    again = _entry("create-project", str(tmp_path / "p"))
    assert again.returncode == 2 and "interpreter shutdown ran" in again.stderr


def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path):
    """`deepdanbooru ... | head -1`: no 'error: Broken pipe' line, the exit code shells give a SIGPIPE."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader went away before the first line
    with open(write, "wb") as stdout:
        result = subprocess.run([sys.executable, "-c", _ENTRY, "make-sample-dataset", str(tmp_path / "d"),
                                 "--count", "2", "--size", "16"], stdout=stdout, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 141 and "error" not in result.stderr and "Traceback" not in result.stderr, result.stderr
