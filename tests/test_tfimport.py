"""TensorFlow's load-time absl lines are filtered by TF_CPP_MIN_LOG_LEVEL; everything else passes."""

import os
import sys

import pytest

from deepdanbooru import tfimport

NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
INFO = "I0000 00:00:1796304923.065242    5273 port.cc:153] oneDNN custom operations are on."
WARN = "W0000 00:00:1796304923.065242    5273 cpu_feature_guard.cc:227] an absl warning"
ERROR = "E0000 00:00:1796304928.780663    5285 cuda_platform.cc:52] failed call to cuInit"
FATAL = "F0000 00:00:1796304928.780663    5285 something.cc:1] check failed"
PLAIN = "UserWarning: something a Python import said"
TFLITE = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


@pytest.mark.parametrize("level, shown", [
    (0, [NOTICE, INFO, WARN, ERROR, FATAL, PLAIN, TFLITE]),
    (1, [WARN, ERROR, FATAL, PLAIN]),
    (2, [ERROR, FATAL, PLAIN]),
    (3, [FATAL, PLAIN]),
])
def test_lines_written_to_descriptor_2_are_filtered_by_level(level, shown, capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", str(level))
    with tfimport.filtered_stderr():
        os.write(2, "\n".join([NOTICE, INFO, WARN, ERROR, FATAL, PLAIN, TFLITE]).encode() + b"\n")
    assert capfd.readouterr().err.splitlines() == shown


def test_an_exception_inside_still_restores_stderr(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    with pytest.raises(ImportError), tfimport.filtered_stderr():
        os.write(2, f"{INFO}\nImportError: libfoo.so\n".encode())
        raise ImportError("libfoo.so")
    os.write(2, b"after\n")
    assert capfd.readouterr().err.splitlines() == ["ImportError: libfoo.so", "after"]


def test_the_finder_wraps_only_tensorflow_and_only_once():
    finder = tfimport._QuietFinder()
    assert finder.find_spec("numpy", None) is None
    tfimport.install_quiet_import()  # tensorflow may already be imported in this process: then a no-op
    if "tensorflow" in sys.modules:
        assert tfimport._FINDER not in sys.meta_path
    tfimport.uninstall_quiet_import()
    assert tfimport._FINDER not in sys.meta_path
