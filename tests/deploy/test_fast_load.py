"""`load` runs a package through torch's C++ loader directly, reads a library's ELF tables in place and remembers
a file's hash: the same outputs as torch's `aoti_load_package`, less of its time."""

import os
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from fullgraph.deploy import _elf, export, load, package
from fullgraph.errors import UsageError

pytestmark = pytest.mark.slow


class TwoHeads(nn.Module):
    """Outputs in a nested structure, so the call spec has work to do."""

    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = nn.Linear(12, 20), nn.Linear(20, 3), nn.Linear(20, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = torch.relu(self.body(x) + y)
        return self.a(h), {"b": self.b(h), "sum": h.sum(-1)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pkg")
    torch.manual_seed(0)
    model = TwoHeads().eval()
    path = export(model, (torch.randn(4, 12), torch.randn(4, 20)), folder / "two.pt2")
    return model, path


def test_load_matches_torchs_loader_and_the_model_on_nested_outputs(built):
    model, path = built
    loaded = load(path)
    assert isinstance(loaded._model, package.PackageCall)  # torch's C++ loader, not aoti_load_package
    reference = torch._inductor.aoti_load_package(path)
    x, y = torch.randn(4, 12), torch.randn(4, 20)
    out = loaded(x, y)
    assert isinstance(out, tuple) and sorted(out[1]) == ["b", "sum"]
    torch.testing.assert_close(out, reference(x, y), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, y), rtol=1e-5, atol=1e-5)
    assert loaded._model.get_metadata()["AOTI_DEVICE_KEY"] == "cpu"


def test_a_loader_class_of_another_signature_falls_back_to_torchs_route(built, monkeypatch):
    model, path = built

    class Other:
        def __init__(self, *args):
            raise TypeError("incompatible constructor arguments")

    monkeypatch.setattr(package, "_loader_class", lambda: Other)
    opened = package.open_package(path)
    assert not isinstance(opened, package.PackageCall)
    x, y = torch.randn(4, 12), torch.randn(4, 20)  # the exported sizes: the package's dims are static
    with torch.no_grad():
        torch.testing.assert_close(opened(x, y), model(x, y), rtol=1e-5, atol=1e-5)


def test_the_elf_tables_read_in_place_equal_a_read_through_the_zip(built):
    _, path = built
    with open(path, "rb") as f, zipfile.ZipFile(f) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".so")]
        assert z.getinfo(name).compress_type == zipfile.ZIP_STORED  # the in-place route is the one taken
        in_place = package._library_facts(z, name)
        with z.open(name) as member:
            through = _elf.facts(_elf.Image.of_file(member))
    assert in_place == through and "libc.so.6" in in_place.needed


def test_a_files_hash_is_remembered_until_the_file_changes(built, tmp_path, monkeypatch):
    _, path = built
    copy = tmp_path / "copy.pt2"
    content = Path(path).read_bytes()
    copy.write_bytes(content)
    copy.chmod(0o644)
    hashed = []
    real = package._sha256
    monkeypatch.setattr(package, "_sha256", lambda f: hashed.append(1) or real(f))
    first, _ = package.inspect_package(copy)
    assert package.inspect_package(copy)[0] == first and len(hashed) == 1  # remembered
    before = os.stat(copy)
    with open(copy, "r+b") as f:  # rewritten in place, same bytes: same inode and size, new ctime
        f.write(content)
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))  # its mtime set back: only the ctime tells
    assert os.stat(copy).st_ctime_ns != before.st_ctime_ns
    assert package.inspect_package(copy)[0] == first and len(hashed) == 2  # hashed again
    assert package.inspect_package(copy)[0] == first and len(hashed) == 2  # and remembered again


def test_inputs_that_do_not_fit_the_package_fail_by_name(built, monkeypatch):
    monkeypatch.delenv(package.CHECK_INPUTS_ENV, raising=False)
    _, path = built
    loaded = load(path)
    assert os.environ[package.CHECK_INPUTS_ENV] == "1"  # the package's own checks are on
    fit = r"inputs \(3x12:float32@cpu, 3x20:float32@cpu\) do not fit .*two.pt2 \(RuntimeError: input_handles\[0\]"
    with pytest.raises(UsageError, match=fit + r".*exported for 4x12"):
        loaded(torch.randn(3, 12), torch.randn(3, 20))  # unchecked, this computed garbage of the wrong shape
