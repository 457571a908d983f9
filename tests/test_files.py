import os
import random
import stat
import sys
from contextlib import contextmanager

import pytest

from fullgraph._files import write_atomic

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@posix_only
@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664), (0o027, 0o640)])
def test_new_file_mode_follows_the_umask(tmp_path, mask, mode):
    path = tmp_path / "report.html"
    with umask(mask):
        write_atomic(path, "x")
    assert _mode(path) == mode


@posix_only
def test_replacing_a_file_takes_the_umask_mode_too(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    path.chmod(0o600)  # what the mkstemp-based writer left behind
    with umask(0o022):
        write_atomic(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o644


def test_writes_the_whole_text_and_leaves_no_temporary_file(tmp_path):
    text = "".join(random.choice('abc<&"é\n') for _ in range(random.randrange(10_000, 20_000)))
    path = tmp_path / "sub" / "dir" / "out.txt"  # folders are created
    write_atomic(path, text)
    write_atomic(path, text[::-1])
    assert path.read_text(encoding="utf-8") == text[::-1]
    assert os.listdir(path.parent) == ["out.txt"]


def test_a_failed_write_keeps_the_old_file_and_cleans_up(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "half written \udcff")  # a lone surrogate cannot be encoded as UTF-8
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_relative_path_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_atomic("plain.txt", "hello")
    assert (tmp_path / "plain.txt").read_text() == "hello"


def test_a_fifo_or_device_is_written_into_not_replaced(tmp_path):
    # `--json /dev/null` once replaced /dev/null with a regular file (renamed over it, as root). A FIFO stands in
    # for the device here: written into, and still a FIFO after.
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_atomic(fifo, "report")
    reader.join(timeout=10)
    assert got == ["report"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary file left beside it
