"""The training lock: one train-project per project, stale locks from dead runs taken over."""

import json
import os
import socket
import subprocess
import sys

import pytest

from deepdanbooru.errors import TrainingError
from deepdanbooru.runstate.lock import TrainingLock


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_lock_is_exclusive_and_released(tmp_path):
    path = tmp_path / ".train.lock"
    with TrainingLock(path, echo=lambda *_: None):
        owner = json.loads(path.read_text())
        assert owner["pid"] == os.getpid()
        assert owner["hostname"] == socket.gethostname()
        with pytest.raises(TrainingError, match="another train-project holds this project"):
            TrainingLock(path).acquire()
        assert json.loads(path.read_text()) == owner  # the refused attempt left it alone
    assert not path.exists()


def test_live_lock_of_another_process_refused(tmp_path):
    path = tmp_path / ".train.lock"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path.write_text(json.dumps({"pid": sleeper.pid, "hostname": socket.gethostname(), "started": 1.0}))
        with pytest.raises(TrainingError, match=f"pid {sleeper.pid}"):
            TrainingLock(path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_lock_taken_over_with_notice(tmp_path):
    path = tmp_path / ".train.lock"
    pid = _dead_pid()
    path.write_text(json.dumps({"pid": pid, "hostname": socket.gethostname(), "started": 1.0}))
    notices = []
    lock = TrainingLock(path, echo=notices.append)
    lock.acquire()
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert len(notices) == 1 and "took over the stale training lock" in notices[0] and str(pid) in notices[0]
    lock.release()
    assert not path.exists()
    assert not list(tmp_path.iterdir())  # the moved-aside stale file is gone too


def test_reused_pid_is_stale(tmp_path):
    # Our own pid is alive, but with a different process start time it is someone else's lock.
    path = tmp_path / ".train.lock"
    path.write_text(json.dumps({"pid": os.getpid(), "hostname": socket.gethostname(), "started": 1.0,
                                "process_start": 1}))
    with TrainingLock(path, echo=lambda *_: None):
        assert json.loads(path.read_text())["started"] != 1.0


def test_lock_from_another_host_refused_with_hint(tmp_path):
    path = tmp_path / ".train.lock"
    path.write_text(json.dumps({"pid": 1, "hostname": "elsewhere.example", "started": 1.0}))
    with pytest.raises(TrainingError, match="host elsewhere.example.*delete this file"):
        TrainingLock(path).acquire()
    assert path.exists()


def test_release_keeps_a_lock_that_is_not_ours(tmp_path):
    path = tmp_path / ".train.lock"
    lock = TrainingLock(path, echo=lambda *_: None)
    lock.acquire()
    other = {"pid": 12345, "hostname": "elsewhere.example", "started": 2.0}
    path.write_text(json.dumps(other))
    lock.release()
    assert json.loads(path.read_text()) == other
