"""The cause of the H200 image's AOTInductor loader crash, reproduced on the CPU: a C++ compiler that links
libstdc++ statically into the package's library (the image's g++ wrapper does) gives it a std::locale of its own,
and creating the model fails (std::bad_cast here, libstdc++ 12) or crashes (SIGSEGV there, libstdc++ 13)."""

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from fullgraph.deploy import DeployError, _elf, build, export, load, probe
from tests.deploy._models import Linears

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared libraries: Linux only")


def _static_gxx(tmp_path: Path, kind: str) -> str:
    """A g++ that links libstdc++ statically into shared libraries, one of two ways: "flag" adds -static-libstdc++
    to every shared-library link; "archive-first", as the H200 image's /opt/gcc/bin/g++ does, passes -B with a
    folder that holds libstdc++.a alone, so the linker finds the archive before any libstdc++.so (there even an
    explicit -lstdc++ links it statically)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++")
    archive = subprocess.run([gxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip("this g++ has no libstdc++.a to link statically")
    wrapper = tmp_path / f"static-g++-{kind}"
    if kind == "flag":
        wrapper.write_text(
            f'#!/bin/sh\ncase " $* " in *" -shared "*) exec {gxx} "$@" -static-libstdc++ ;; esac\nexec {gxx} "$@"\n'
        )
    else:
        folder = tmp_path / "archive-only"
        folder.mkdir()
        (folder / "libstdc++.a").symlink_to(archive)
        wrapper.write_text(f'#!/bin/sh\nexec {gxx} -B{folder}/ "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


@pytest.fixture
def static_cxx(request, tmp_path, monkeypatch):
    """Inductor's C++ compiler replaced by a g++ that links libstdc++ statically (`_static_gxx`, "flag" unless the
    test parametrizes it), with an Inductor cache of its own (a library built by the plain compiler must not be
    reused)."""
    wrapper = _static_gxx(tmp_path, getattr(request, "param", "flag"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with torch._inductor.config.patch({"cpp.cxx": (None, wrapper)}):
        yield wrapper


@pytest.mark.parametrize("kind", ["flag", "archive-first"])
def test_only_the_runtimes_file_name_links_libstdcxx_dynamically_under_both_compilers(tmp_path, kind):
    gxx = _static_gxx(tmp_path, kind)
    src = tmp_path / "t.cpp"
    src.write_text("#include <locale>\nconst std::locale& f() { static std::locale l; return l; }\n")
    found = {}
    for name, extra in (("none", []), ("-lstdc++", ["-lstdc++"]), ("export's", ["-l" + build.LIBSTDCXX])):
        out = tmp_path / f"t{len(found)}.so"
        subprocess.run([gxx, "-shared", "-fPIC", str(src), "-o", str(out), *extra], check=True, capture_output=True)
        found[name] = _elf.file_facts(out)
    assert found["none"].static_libstdcxx
    # under the archive-first compiler -lstdc++ finds the archive again: why export names the runtime's file
    assert found["-lstdc++"].static_libstdcxx == (kind == "archive-first")
    assert "libstdc++.so.6" in found["export's"].needed and not found["export's"].static_libstdcxx


def libraries(path) -> dict[str, _elf.ElfFacts]:
    with zipfile.ZipFile(path) as z:
        return {n: _elf.facts(_elf.Image.of_file(z.open(n))) for n in z.namelist() if n.endswith(".so")}


def model_and_inputs():
    torch.manual_seed(0)
    return Linears().eval(), (torch.randn(3, 8),)


def test_elf_facts_of_torchs_own_library():
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    found = _elf.file_facts(lib)
    assert any(n.startswith("libstdc++.so") for n in found.needed) and "libc10.so" in found.needed
    assert not found.static_libstdcxx
    with pytest.raises(ValueError, match="not a 64-bit"):
        _elf.Image(lambda offset, size: b"MZ" + bytes(62))


def test_link_libstdcxx_adds_the_library_once_and_keeps_the_given_ones():
    lib = build.LIBSTDCXX
    assert build.link_libstdcxx({}) == {"aot_inductor.custom_op_libs": [lib]}
    given = {"aot_inductor.custom_op_libs": ["myops"]}
    assert build.link_libstdcxx(given) == {"aot_inductor.custom_op_libs": ["myops", lib]}
    assert build.link_libstdcxx({"aot_inductor.custom_op_libs": [lib]}) == {"aot_inductor.custom_op_libs": [lib]}


@pytest.mark.slow
def test_a_package_with_static_libstdcxx_fails_in_torchs_loader_and_is_refused_by_ours(tmp_path, static_cxx):
    model, inputs = model_and_inputs()
    program = torch.export.export(model, inputs)
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "plain.pt2"))
    (found,) = libraries(path).values()
    assert found.static_libstdcxx and found.carries_libstdcxx
    # torch's own loader, in a child: the failure the check exists for (bad_cast here; SIGSEGV on libstdc++ 13)
    # (its TMPDIR in tmp_path: the loader's unpacked libraries stay behind when it crashes)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.run([sys.executable, "-c", f"import torch; torch._inductor.aoti_load_package({path!r})"],
                           capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert child.returncode != 0
    assert "bad_cast" in child.stderr or child.returncode < 0, child.stderr[-2000:]
    os.chmod(path, 0o644)
    with pytest.raises(DeployError, match=r"libstdc\+\+ linked in statically.*Export it again"):
        load(path)
    with pytest.raises(DeployError, match="linked in statically"):
        probe(path)  # refused before any child runs it


@pytest.mark.slow
@pytest.mark.parametrize("static_cxx", ["flag", "archive-first"], indirect=True)
def test_export_links_libstdcxx_dynamically_under_that_compiler_and_the_package_loads(tmp_path, static_cxx):
    model, inputs = model_and_inputs()
    path = export(model, inputs, tmp_path / "m.pt2")
    (found,) = libraries(path).values()
    assert "libstdc++.so.6" in found.needed and not found.static_libstdcxx
    loaded = load(path)  # probed in a child first, then loaded here
    assert loaded.verdict["ok"]
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.slow
def test_export_refuses_to_write_a_package_that_still_carries_libstdcxx(tmp_path, static_cxx, monkeypatch):
    monkeypatch.setattr(build, "link_libstdcxx", lambda options: {})  # a torch without the setting
    model, inputs = model_and_inputs()
    with pytest.raises(DeployError, match=r"linked in statically.*Not written.*static-g\+\+-"):
        export(model, inputs, tmp_path / "m.pt2")
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".pt2" or p.name.startswith(".")) == []
