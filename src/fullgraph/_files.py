"""File writing shared by every layer that saves something a reader may open at any moment."""

from __future__ import annotations

import os
import secrets
import stat

# Exclusive creation refuses an existing name (a symlink planted there included); O_NOFOLLOW where the OS has it.
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write all of `text` to `path` or leave it as it was: written beside it, then renamed over it.

    The file gets the mode any new file gets (0666 less the umask: 0644 under umask 022). `tempfile.mkstemp`
    would make it 0600, unreadable to the group and the web server that a report is shared with; creating the
    temporary file with mode 0666 lets the kernel apply the umask, with no process-wide `os.umask` round trip.
    """
    path = os.fspath(path)
    if _special(path):  # /dev/null, /dev/stdout, a FIFO: write into it; renaming over it would replace the device
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = _create_beside(folder, os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _special(path: str) -> bool:
    """An existing path that is not a regular file (a device, a FIFO, a socket): a stream to write into."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _create_beside(folder: str, name: str) -> tuple[int, str]:
    """A new hidden file in `folder` named after `name`, open for writing, and its path."""
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o666), tmp
        except FileExistsError:
            continue  # a leftover or a concurrent writer drew the same name: draw again
    raise FileExistsError(f"no free temporary name beside {os.path.join(folder, name)} after 100 tries")
