"""Files the tool writes whole or not at all (standard library only)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def create_beside(path: Path) -> tuple[int, Path]:
    """A new hidden file next to `path` (same file system, so the final rename is atomic).

    Opened with mode 0o666 like open() does, so the umask, not a private 0o600,
    decides who may read what the tool writes.
    """
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temporary
        except FileExistsError:
            continue
        except OSError as error:
            # Named after the file being written, not the hidden one (a read-only folder, a full disk).
            raise OSError(error.errno, error.strerror, str(path)) from None


def write_bytes_atomic(path, content: bytes) -> None:
    """Write beside the target and rename, so a reader never sees half a file."""
    path = Path(path)
    handle, temporary = create_beside(path)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_text_atomic(path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
