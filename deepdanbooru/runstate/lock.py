"""One train-project per project: an exclusive lock file holding pid, host and start time (standard library only).

The file is created with O_EXCL, so two starts cannot both win. A run killed
with SIGKILL leaves its lock behind; on the same host a lock whose process is
gone (or whose pid now belongs to a newer process) is stale and taken over
with a notice. A lock from another host cannot be checked, so it is refused
with the command to remove it by hand. Preflight reads the same file with
`read_owner` and `owner_is_stale` to say what the next train-project will do.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from deepdanbooru.errors import TrainingError, file_field


def _process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (Linux), to tell a reused pid from the original."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after the last ')' are fixed.
    fields = stat[stat.rindex(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def read_owner(path) -> dict | None:
    """The lock's owner record; None when there is no lock file, {} when its content is unreadable."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        owner = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        # A run killed between create and write leaves an empty file; treat as unknown owner.
        return {}
    return owner if isinstance(owner, dict) else {}


def owner_is_stale(path, owner: dict, hostname: str | None = None) -> bool:
    """Whether the run that wrote `owner` is surely gone, so its lock may be taken over."""
    if not owner:
        # Unreadable content: only stale if it is old enough that its writer surely finished writing.
        try:
            return time.time() - Path(path).stat().st_mtime > 60
        except FileNotFoundError:
            return True
    if owner.get("hostname") != (hostname or socket.gethostname()):
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or not _pid_alive(pid):
        return True
    recorded = owner.get("process_start")
    current = _process_start_ticks(pid)
    return recorded is not None and current is not None and recorded != current


def describe_owner(owner: dict) -> str:
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {owner.get('pid')} on host {owner.get('hostname')} since {when}"


class TrainingLock:
    """Context manager: `with TrainingLock(paths.lock, echo): train...`."""

    def __init__(self, path, echo=print):
        self.path = Path(path)
        self.echo = echo
        self.owner = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "started": time.time(),
            "process_start": _process_start_ticks(os.getpid()),
        }
        self._held = False

    def acquire(self) -> None:
        # Two attempts: the second follows taking over a stale lock.
        for _ in range(2):
            if self._try_create():
                self._held = True
                return
            owner = read_owner(self.path)
            if owner is None:
                # Vanished between our create and our read: its owner just released it.
                continue
            if not owner_is_stale(self.path, owner, self.owner["hostname"]):
                raise TrainingError(file_field(
                    self.path, None,
                    f"another train-project holds this project ({describe_owner(owner)}); wait for it to finish"
                    if owner.get("hostname") == self.owner["hostname"] else
                    f"locked by {describe_owner(owner)}; if no training runs there any more, delete this file"))
            self._take_over(owner)
        raise TrainingError(file_field(self.path, None, "could not acquire the training lock; another run "
                                                        "started at the same moment"))

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        owner = read_owner(self.path)
        if owner is not None and owner.get("pid") == self.owner["pid"] \
                and owner.get("started") == self.owner["started"]:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def _try_create(self) -> bool:
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            json.dump(self.owner, stream)
            stream.flush()
            os.fsync(stream.fileno())
        return True

    def _take_over(self, owner: dict) -> None:
        """Move the stale file aside atomically; if what moved is not what we judged stale, put it back."""
        aside = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return
        try:
            moved = json.loads(aside.read_text(encoding="utf-8") or "{}")
        except (OSError, json.JSONDecodeError):
            moved = {}
        if moved != owner and moved:
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        self.echo(f"notice: took over the stale training lock {self.path} left by {describe_owner(owner)}, "
                  "which is no longer running")
