import os

import pytest
import torch

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
