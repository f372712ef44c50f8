"""Import TensorFlow without the log lines its libraries print while loading.

TensorFlow 2.21's libraries log through absl before absl's logging is set
up, and such lines ignore TF_CPP_MIN_LOG_LEVEL: every command that loads
TensorFlow printed six of them ("WARNING: All log messages before
absl::InitializeLog() ...", "I0000 ... oneDNN custom operations are on",
"I0000 ... Could not find cuda drivers", each twice). Once
`install_quiet_import` is called (the CLI does, before any command runs),
the first `import tensorflow`, wherever it happens, runs with file
descriptor 2 captured; afterwards each captured line is written
back to stderr unless it is an absl-format line below TF_CPP_MIN_LOG_LEVEL
(0: all, 1: no INFO, 2: no WARNING, 3: no ERROR; FATAL always shown) or
absl's own notice or a TensorFlow Lite "INFO: " line, which go with INFO.
`filtered_stderr` does the same around other calls. Anything else (a Python warning,
an error message) comes through unchanged. Standard library only.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# TensorFlow Lite's own logger: "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." when an interpreter starts.
_TFLITE_INFO = "INFO: "
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 99}


def _level() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def keep_line(line: str, level: int) -> bool:
    """Whether a line TensorFlow printed while loading is shown at TF_CPP_MIN_LOG_LEVEL `level`."""
    if line.strip() == _ABSL_NOTICE or line.startswith(_TFLITE_INFO):
        return level < 1
    match = _ABSL_LINE.match(line)
    return match is None or _SEVERITY[match.group(1)] >= level


@contextlib.contextmanager
def filtered_stderr():
    """Capture file descriptor 2 for the block, then write back the lines `keep_line` keeps.

    Also for TensorFlow calls whose C++ side prints at INFO level on every run (a TFLite interpreter).
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable stderr: nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            level = _level()
            kept = [line for line in capture.read().decode("utf-8", "replace").splitlines()
                    if keep_line(line, level)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()


class _QuietLoader(importlib.abc.Loader):
    """The real loader of the tensorflow package, run with stderr filtered."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with filtered_stderr():
            self._loader.exec_module(module)


class _QuietFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "tensorflow":
            return None
        uninstall_quiet_import()  # one import only; also keeps the lookup below from finding us again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


_FINDER = _QuietFinder()


@contextlib.contextmanager
def quiet_stdout():
    """The converters (TFLite, tf2onnx) print a "Saved artifact at ..." banner plus one line per captured
    variable to stdout: hundreds of lines that would bury the report."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def install_quiet_import() -> None:
    """Filter TensorFlow's load-time log lines whenever (and if ever) this process imports it."""
    if "tensorflow" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall_quiet_import() -> None:
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_FINDER)
