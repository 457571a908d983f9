"""File writing shared by every layer that saves something a reader may open at any moment."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write all of `text` to `path` or leave it as it was: written beside it, then renamed over it."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
