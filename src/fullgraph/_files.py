"""File writing shared by every layer that saves something a reader may open at any moment.

Every save is written beside its target under a temporary name, then renamed over it: a reader sees the old file or
the new one, never half of one. What can still go wrong, and what happens then:

- the process is killed mid-write: its temporary file (or work folder) stays behind. The names say whose it was,
  `.<name>.tmp-<host>-<pid>-<random>` (`temp_name`), so the next save of the same target removes those of processes
  of this host that are gone (`sweep_stale`), and keeps those of live ones, which may still be writing;
- the disk fills (or a quota, or the process's file size limit, `ulimit -f`, is reached): the temporary file is
  removed, the target is left as it was, and the error is a `DiskFullError` naming the path and the free space;
- two processes update one file (a memo of verdicts): `locked` holds an advisory lock on `<file>.lock` around
  their read-modify-write, so neither loses the other's entries.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterable, Iterator

from fullgraph.errors import FullgraphError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; updates are atomic but may lose a concurrent writer's entry
    fcntl = None

# Exclusive creation refuses an existing name (a symlink planted there included); O_NOFOLLOW where the OS has it.
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# A short tag of this host in temporary names: on a folder shared between machines, a pid is only checked on its own.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
# What a full disk looks like: (errno, the words of its message when a library passes it on as text, what we say).
_FULL = (
    (errno.ENOSPC, "No space left on device", "no space left on the device"),
    (errno.EFBIG, "File too large", "the file is larger than this process may write (its file size limit, ulimit -f)"),
    (errno.EDQUOT, "Disk quota exceeded", "the disk quota is exceeded"),
)


class DiskFullError(FullgraphError, OSError):
    """A save that found no room: nothing was written (a file already there is unchanged). Still an OSError."""


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write all of `text` to `path` (UTF-8) or leave it as it was (see the module docstring).

    The file gets the mode any new file gets (0666 less the umask: 0644 under umask 022). `tempfile.mkstemp`
    would make it 0600, unreadable to the group and the web server that a report is shared with; creating the
    temporary file with mode 0666 lets the kernel apply the umask, with no process-wide `os.umask` round trip.
    """
    write_atomic_bytes(path, (text.encode("utf-8"),))


def write_atomic_bytes(path: str | os.PathLike, chunks: Iterable[bytes], *, mode: int | None = None) -> None:
    """Write `chunks` to `path` whole or not at all: beside it under `temp_name`, then renamed over it. `mode`: the
    file's mode whatever the umask (None: the umask's). Stale temporary files of this target go first
    (`sweep_stale`); a full disk raises `DiskFullError` with nothing left behind."""
    path = os.fspath(path)
    if _special(path):  # /dev/null, /dev/stdout, a FIFO: write into it; renaming over it would replace the device
        with open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        return
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    sweep_stale(path)
    # Created 0600 when a mode is given: no one else may open it for writing before its mode is set.
    fd, tmp = _create_beside(path, 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            for chunk in chunks:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        full = disk_full(path, e)
        if full is not None:
            raise full from None
        raise


def _special(path: str) -> bool:
    """An existing path that is not a regular file (a device, a FIFO, a socket): a stream to write into."""
    try:
        st_mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(st_mode) and not stat.S_ISDIR(st_mode)


def temp_name(path: str | os.PathLike) -> str:
    """A fresh temporary path beside `path`: `.<name>.tmp-<host>-<pid>-<random>` (hidden, and recognisable by
    `sweep_stale` as this process's)."""
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(folder, f".{name}.tmp-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}")


def temp_dir_beside(path: str | os.PathLike) -> str:
    """A new private work folder beside `path`, named as `temp_name` names files (stale ones swept first): for a
    save built in pieces (a package, a serialized function) before its result is renamed onto `path`."""
    sweep_stale(path)
    for _ in range(100):
        work = temp_name(path)
        try:
            os.mkdir(work, 0o700)
            return work
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {os.fspath(path)} after 100 tries")


def _create_beside(path: str, perm: int) -> tuple[int, str]:
    """A new temporary file beside `path` (created with `perm` less the umask), open for writing, and its path."""
    for _ in range(100):
        tmp = temp_name(path)
        try:
            return os.open(tmp, _FLAGS, perm), tmp
        except FileExistsError:
            continue  # a leftover or a concurrent writer drew the same name: draw again
    raise FileExistsError(f"no free temporary name beside {path} after 100 tries")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        return True
    return True


def sweep_stale(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files and work folders that killed processes of this host left beside `path` (named by
    `temp_name`); those of live processes, of other hosts and anything else are kept. Returns what was removed."""
    folder, name = os.path.split(os.fspath(path))
    pattern = re.compile(rf"\.{re.escape(name)}\.tmp-{_HOST}-(\d+)-[0-9a-f]+")
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return []
    removed = []
    for entry in entries:
        found = pattern.fullmatch(entry)
        if found is None or _alive(int(found.group(1))):
            continue
        stale = os.path.join(folder, entry)
        with contextlib.suppress(OSError):
            if os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale)
            else:
                os.unlink(stale)
            removed.append(stale)
    return removed


def disk_full(path: str | os.PathLike, e: BaseException) -> DiskFullError | None:
    """The error to raise for `e` when it (or an error it was raised from) says the disk is full, the quota is
    exceeded or the file size limit is reached while saving `path`; None for any other error."""
    seen: set[int] = set()
    cause: BaseException | None = e
    hit = None
    while cause is not None and hit is None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DiskFullError):
            return cause
        code = cause.errno if isinstance(cause, OSError) else None
        hit = next((f for f in _FULL if code == f[0] or f[1] in str(cause)), None)
        if hit is None:
            cause = cause.__cause__ or cause.__context__
    if hit is None:
        return None
    code, _, why = hit
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free in {folder}"
    except OSError:
        free = f"free space in {folder} unknown"
    failed = getattr(cause, "filename", None)
    where = f" (writing {failed})" if failed and os.path.abspath(os.fspath(failed)) != os.path.abspath(path) else ""
    full = DiskFullError(
        f"could not save {path}: {why}{where}; {free}. Nothing was written (a file already there is unchanged): "
        "free space there or save elsewhere"
    )
    full.errno = code
    return full


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive advisory lock (`flock`) on `<path>.lock`, held for the block: what a read-modify-write of `path`
    that other processes also update runs under. The lock file stays (removing it would race a waiter)."""
    if fcntl is None:
        yield
        return
    lock = f"{os.fspath(path)}.lock"
    os.makedirs(os.path.dirname(lock) or ".", exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
