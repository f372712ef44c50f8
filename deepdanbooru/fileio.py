"""Files the tool writes whole or not at all (standard library only)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path, content: bytes) -> None:
    """Write beside the target and rename, so a reader never sees half a file."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
