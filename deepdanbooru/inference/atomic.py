"""Writing binary files whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(path, content: bytes) -> None:
    """Write beside the target and rename, so no reader ever sees half a file."""
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
