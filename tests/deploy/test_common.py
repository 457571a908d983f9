import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fullgraph import _files
from fullgraph.deploy import DeployError, input_signature
from fullgraph.deploy._common import environment, mismatches, open_trusted, write_private


def test_write_private_ignores_a_loose_umask_and_replaces_whole(tmp_path):
    path = tmp_path / "sub" / "f.bin"
    old = os.umask(0o002)  # a group-writable default, common with per-user groups
    try:
        write_private(path, [b"a", b"bc"])
    finally:
        os.umask(old)
    assert path.read_bytes() == b"abc"
    assert path.stat().st_mode & 0o777 == 0o644

    def failing():
        yield b"x"
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_private(path, failing())
    assert path.read_bytes() == b"abc"  # the failed write left the old file, and no temporary beside it
    assert os.listdir(path.parent) == ["f.bin"]


def test_open_trusted_checks_owner_mode_and_folder(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "f.bin"
    write_private(path, [b"x"])
    with open_trusted(path, "test file") as f:
        assert f.read() == b"x"
    folder.chmod(0o777)  # anyone may rename files in it, so anyone could swap this one
    with pytest.raises(DeployError, match=r"its folder .* is writable by other users \(mode 777\)"):
        open_trusted(path, "test file")
    folder.chmod(0o1777)  # sticky, like /tmp: only a file's owner may rename it
    open_trusted(path, "test file").close()
    with pytest.raises(DeployError, match="is a folder"):
        open_trusted(folder, "test file")
    with pytest.raises(DeployError, match="does not exist"):
        open_trusted(folder / "missing.bin", "test file")


def test_a_file_owned_by_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a file another user's needs root")
    path = tmp_path / "f.bin"
    write_private(path, [b"x"])
    os.chown(path, 12345, -1)
    with pytest.raises(DeployError, match=r"belongs to uid 12345, not to you \(0\) or root"):
        open_trusted(path, "test file")


def test_input_signature_names_shapes_dtypes_devices_and_values():
    x = torch.randn(4, 3, 5, dtype=torch.bfloat16)
    assert input_signature((x, [torch.zeros(2, dtype=torch.int64)], 0.5)) == ("4x3x5:bfloat16@cpu, 2:int64@cpu, 0.5")
    assert input_signature((), {"mask": torch.ones(1, 7, dtype=torch.bool)}) == "1x7:bool@cpu"


def test_environment_and_mismatches():
    here = environment()
    assert here["torch"] == torch.__version__
    assert (here["device"] == "cpu") == (here["capability"] is None)
    assert mismatches({**here, "torch": "1.0"}, here, ("torch", "device")) == [
        f"torch 1.0 there, {torch.__version__} here"
    ]


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_removes_what_killed_saves_left_and_keeps_live_ones(tmp_path):
    path = tmp_path / "m.bin"
    dead = _files.temp_name(path).replace(f"-{os.getpid()}-", f"-{dead_pid()}-")
    live = _files.temp_name(path)  # this process's: it may still be writing
    other_host = dead.replace(f".tmp-{_files._HOST}-", ".tmp-abcdef-")  # a pid there is not ours to check
    work = _files.temp_name(path).replace(f"-{os.getpid()}-", f"-{dead_pid()}-")  # a killed export's work folder
    for p in (dead, live, other_host):
        Path(p).write_bytes(b"half")
    os.mkdir(work)
    Path(work, "model.so").write_bytes(b"half")
    write_private(path, [b"whole"])
    assert path.read_bytes() == b"whole"
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (path, live, other_host))


# A child process whose file size limit is 64 KiB: a larger write fails with EFBIG, as on a full disk.
LIMITED = """
import json, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
from fullgraph.deploy._common import write_private
try:
    write_private(sys.argv[1], [b"x" * 200_000])
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "oserror": isinstance(e, OSError), "msg": str(e)}))
"""


def test_a_save_that_finds_no_room_names_the_path_and_the_free_space_and_leaves_nothing(tmp_path):
    path = tmp_path / "cache.bin"
    path.write_bytes(b"old")
    done = subprocess.run([sys.executable, "-c", LIMITED, str(path)], capture_output=True, text=True, timeout=120)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["type"] == "DiskFullError" and got["oserror"], got
    assert got["msg"].startswith(f"could not save {path}: the file is larger than this process may write"), got
    assert re.search(r"; [\d.]+ MiB free in \S+\. Nothing was written", got["msg"]) and "\n" not in got["msg"]
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["cache.bin"]


def test_disk_full_is_found_in_the_errors_a_library_raises_from_it(tmp_path):
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "inductor" / "k.so"))
        except OSError as inner:
            raise RuntimeError("C++ compile failed") from inner
    except RuntimeError as e:
        full = _files.disk_full(tmp_path / "m.pt2", e)
    assert isinstance(full, _files.DiskFullError) and full.errno == errno.ENOSPC
    assert str(full).startswith(f"could not save {tmp_path / 'm.pt2'}: no space left on the device (writing ")
    assert _files.disk_full(tmp_path / "m.pt2", RuntimeError("shape mismatch")) is None
