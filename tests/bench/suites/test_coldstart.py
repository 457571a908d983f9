import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fullgraph.bench.suites import coldstart as suite
from fullgraph.errors import UsageError
from tests.bench.suites import run_suite

ROOT = Path(__file__).resolve().parents[3]
# The smallest model: the CPU default ViT cut to one block, batch 1.
SMALL = ("--model", "vit_mini", "--depth", "1", "--batch", "1")


class Linears(torch.nn.Module):
    """Two matrix multiplies: Inductor calls them out (no C++ kernel to build), so every route takes seconds."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def linears():
    torch.manual_seed(0)
    return Linears()


LINEARS = suite.ModelSpec(f"{__name__}:linears", {}, lambda model, batch: [torch.randn(batch, 8)], "two linears")


def crash_outside_pytest(**kwargs):
    """A model builder that kills its process with SIGSEGV unless it runs under pytest: the suite's children (clean
    environment, no PYTEST_CURRENT_TEST) die as the H200's package loader did, the reference built here works."""
    if "PYTEST_CURRENT_TEST" not in os.environ:
        os.kill(os.getpid(), signal.SIGSEGV)
    return suite.vit(**kwargs)


def by_route(rows, metric):
    return {r.variant: r.value for r in rows if r.metric == metric}


def test_every_route_runs_in_its_own_process_and_the_warm_ones_hit_the_caches(tmp_path, monkeypatch, capsys):
    # Two linear layers: the suite's mechanics at seconds per process (the library's ViT: the slow test below).
    monkeypatch.setitem(suite.MODELS, "linears", LINEARS)
    work = tmp_path / "work"
    rows, timed = run_suite(tmp_path, "coldstart", "--model", "linears", "--workdir", str(work))
    assert timed == set(suite.ROUTES)
    assert all(v == 1 for v in by_route(rows, "ok").values()) and len(by_route(rows, "ok")) == 8, rows
    hit, miss = by_route(rows, "fxgraph_cache_hit"), by_route(rows, "fxgraph_cache_miss")
    assert hit["cold"] == 0 and miss["cold"] >= 1, (hit, miss)  # an empty folder: Inductor compiled
    assert hit["warm"] >= 1 and miss["warm"] == 0, (hit, miss)  # the folder cold filled
    assert hit["artifacts"] >= 1 and miss["artifacts"] == 0, (hit, miss)  # an empty folder, filled by load_cache
    assert by_route(rows, "autograd_cache_hit")["artifacts"] >= 1
    assert hit["package"] == miss["package"] == 0  # the package's process compiled nothing
    assert hit["precompiled"] == miss["precompiled"] == 0  # nor did the precompiled one: no graph reached Inductor
    load = by_route(rows, "load_s")
    assert load["cold"] == load["warm"] == 0 and load["artifacts"] > 0 and load["package"] > 0, load
    assert load["precompiled"] > 0
    assert "package" not in by_route(rows, "build_s")  # no model built: the weights are in the package
    errors = by_route(rows, "rel_err")
    assert set(errors) == timed and all(e < 1e-5 for e in errors.values()), errors
    first, call = by_route(rows, "first_output_s"), by_route(rows, "first_call_s")
    assert all(first[r] == pytest.approx(load[r] + call[r]) for r in timed), (first, load, call)
    for route in timed:  # the parent's wall time holds the phases the child measured
        inside = sum(by_route(rows, m).get(route, 0) for m in ("import_torch_s", "import_fullgraph_s", "build_s"))
        assert 0 < inside + first[route] < by_route(rows, "process_s")[route], route
    assert by_route(rows, "probe_ok") == {"setup: export package": 1}
    assert by_route(rows, "export_s")["setup: export package"] > 0
    sizes = by_route(rows, "file_bytes")
    assert (work / "model.fgcache").stat().st_size == sizes["setup: save artifacts"]
    assert (work / "model.pt2").stat().st_size == sizes["setup: export package"]
    assert (work / "model.fgpre").stat().st_size == sizes["setup: precompile"]
    assert (work / "cold.log").read_text().startswith("$ ")  # each process's output is kept in --workdir
    out = capsys.readouterr().out
    assert "each route a fresh process" in out and "setup: export package: built in" in out and "failed" not in out
    assert "setup: precompile: compiled and saved in" in out


def test_a_child_killed_by_a_signal_is_a_failed_route_with_its_error(tmp_path, monkeypatch, capsys):
    crashing = dataclasses.replace(suite.MODELS["vit_mini"], build=f"{__name__}:crash_outside_pytest")
    monkeypatch.setitem(suite.MODELS, "crashing", crashing)
    work = tmp_path / "work"
    rows, timed = run_suite(tmp_path, "coldstart", "--model", "crashing", "--routes", "cold", "--workdir", str(work))
    assert timed == set() and by_route(rows, "ok") == {"cold": 0}
    error = json.loads(next(r.params for r in rows if r.variant == "cold"))["error"]
    assert error.startswith("exit -11, SIGSEGV: Fatal Python error: Segmentation fault"), error
    out = capsys.readouterr().out
    assert "cold: failed: exit -11, SIGSEGV" in out
    assert by_route(rows, "process_s")["cold"] > 0
    assert "in crash_outside_pytest" in (work / "cold.log").read_text()  # faulthandler's stack, kept


def _plan(**changes):
    return suite.Plan(**{"model": "vit_mini", "batch": 1, "dtype": "fp32", "preset": "dev", "device": "cpu",
                         "depth": 1, "reps": 2, **changes})  # fmt: skip


def test_a_package_that_cannot_load_fails_its_route_with_the_loaders_words(tmp_path):
    plan, work = _plan(), str(tmp_path)
    expected = suite.write_inputs(plan, work)
    package = tmp_path / "model.pt2"
    package.write_bytes(b"PK\x03\x04 a package cut short")
    package.chmod(0o644)
    child = suite.run_child("package", "load-package", plan, work, "inductor-package", package=str(package))
    assert not child.ok and child.output is None
    assert child.error.startswith("exit 1: DeployError: model.pt2 is not a readable package"), child.error
    assert child.report["import_torch_s"] > 0 and "load_s" not in child.report  # its phases up to the failed load
    rows, table = suite.report(plan, {"package": child}, expected)
    assert by_route(rows, "ok") == {"package": 0} and "rel_err" not in {r.metric for r in rows}
    assert "package: failed: exit 1: DeployError" in table


def test_a_child_past_its_timeout_is_stopped_and_failed(tmp_path):
    plan, work = _plan(timeout=0.2), str(tmp_path)
    suite.write_inputs(plan, work)
    child = suite.run_child("cold", "compile", plan, work, "inductor-cold")
    assert not child.ok and child.error == "took over 0.2 s and was stopped (--timeout)"


def test_the_child_runs_as_a_module_and_reports_without_import_times(tmp_path):
    # Under `python -m`, fullgraph.deploy imports torch before the module runs: no import times, one JSON line.
    argv = ["-m", "fullgraph.deploy.coldstart", "load-package", "--build", "x:y", "--inputs", str(tmp_path / "in.pt")]
    suite.write_inputs(_plan(), str(tmp_path))
    os.replace(tmp_path / "inputs.pt", tmp_path / "in.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FULLGRAPH_CACHE_DIR": str(tmp_path / "fg")}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["error"] == "UsageError: load-package needs --package"
    assert report["import_torch_s"] is None and report["device_s"] >= 0


def test_the_imports_before_the_window_hold_inductors_compiler_for_every_route_that_compiles_or_loads_code():
    # torch imports Inductor's compiler lazily, at the first compile or load of compiled code (~500 modules, 1-4 s
    # without bytecode): before the timed window for every such route alike, never for the package route
    code = ("import sys, fullgraph.deploy.coldstart as c; c.prepare(sys.argv[1]); "
            "print('torch._inductor.compile_fx' in sys.modules, 'torch._dynamo' in sys.modules)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    seen = {}
    for action in ("compile", "serve", "load-precompiled", "load-package"):
        done = subprocess.run([sys.executable, "-c", code, action], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        seen[action] = done.stdout.split()
    assert seen == {"compile": ["True", "True"], "serve": ["True", "True"], "load-precompiled": ["True", "True"],
                    "load-package": ["False", "False"]}  # fmt: skip


@pytest.mark.slow
def test_the_library_vit_warm_starts_from_its_caches(tmp_path):
    # The routes through Inductor's caches (the package and precompiled routes' mechanics: the test above, and our
    # ops inside a package: tests/deploy/test_ops_package.py; each costs a ViT export more, ~70 s of CI's time).
    routes = ("cold", "warm", "artifacts")
    rows, timed = run_suite(tmp_path, "coldstart", *SMALL, "--routes", ",".join(routes))
    assert timed == set(routes) and all(v == 1 for v in by_route(rows, "ok").values())
    hit, miss = by_route(rows, "fxgraph_cache_hit"), by_route(rows, "fxgraph_cache_miss")
    assert miss["cold"] >= 1 and hit["warm"] >= 1 and miss["warm"] == 0 and hit["artifacts"] >= 1
    assert miss["artifacts"] == 0, (hit, miss)
    errors = by_route(rows, "rel_err")
    assert set(errors) == timed and all(e < 1e-4 for e in errors.values()), errors
    first = by_route(rows, "first_output_s")
    assert first["warm"] < first["cold"], first  # what a warm cache buys: Inductor's work came from it


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"model": "resnet"}, "--model 'resnet': choose one of vit_mini"),
        ({"dtype": "int8"}, "--dtype 'int8'"),
        ({"batch": 0}, "--batch 0: give a positive number"),
        ({"preset": "fastest"}, "unknown preset 'fastest'"),
        ({"routes": ("warm",)}, "warm reuses the cache folder that cold fills"),
        ({"timeout": 0}, "--timeout 0"),
    ],
)
def test_bad_plans_are_refused_by_name(changes, match):
    with pytest.raises(UsageError, match=match):
        _plan(**changes)


@pytest.mark.parametrize("spec", ["hot", "cold,,lukewarm", ","])
def test_bad_routes(spec):
    with pytest.raises(UsageError, match="--routes"):
        suite.parse_routes(spec)


def test_routes_run_in_their_order_whatever_the_order_given():
    assert suite.parse_routes("package, cold") == ("cold", "package")
    assert suite.parse_routes(None) == suite.ROUTES


def test_rel_err_needs_outputs_of_the_reference_shapes():
    import torch

    ref = [torch.randn(3, 5)]
    assert suite.rel_err(None, ref) is None and suite.rel_err([torch.randn(5, 3)], ref) is None
    assert suite.rel_err([ref[0] * 1.01], ref) == pytest.approx(0.01, rel=1e-4)


def test_a_missing_bytecode_cache_is_noted_under_the_table():
    def child(torch_pyc, dont_write=False):
        bytecode = {"dont_write": dont_write, "prefix": None, "torch_pyc": torch_pyc}
        return suite.Child("cold", True, None, 1.0, {"bytecode": bytecode})

    assert suite._bytecode_note({"cold": child(True, dont_write=True)}) == []  # .pyc there: reused, nothing to say
    assert suite._bytecode_note({"cold": suite.Child("cold", False, "died", None)}) == []  # nothing reported
    (note,) = suite._bytecode_note({"cold": child(True), "warm": child(False, dont_write=True)})
    assert "no .pyc for torch and writes none (PYTHONDONTWRITEBYTECODE)" in note
    (note,) = suite._bytecode_note({"cold": child(False)})
    assert "no .pyc for torch:" in note and "writes none" not in note


def test_the_child_reports_whether_torch_has_bytecode():
    from fullgraph.deploy import coldstart

    found = coldstart.bytecode_cache()
    pyc = Path(importlib.util.cache_from_source(torch.__file__))
    assert found["torch_pyc"] == pyc.exists()
    assert found["dont_write"] == bool(sys.flags.dont_write_bytecode or sys.dont_write_bytecode)


def test_pad_decisions_read_inductors_local_cache_and_name_which_matmuls_were_padded(tmp_path):
    # Inductor's shape padding is a timing taken while compiling, kept in the local cache only: the fleet reports
    # each replica's choices so that replicas compiling at once can be seen to choose apart. A child process: the
    # cache directory is read once per process.
    code = """
from torch._inductor.fx_passes import pad_mm
from fullgraph.deploy.coldstart import pad_decisions
print(pad_decisions())
pad_mm.set_cached_should_pad("mm 788x768x2304", True)
pad_mm.set_cached_should_pad("mm 788x768x768", False)
first = pad_decisions()
pad_mm.set_cached_should_pad("mm 788x768x768", True)
print(first, pad_decisions(), sep="\\n")
"""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    none, one, two = out.split()[0], out.split()[1:3], out.split()[3:5]
    assert none == "None" and one[0] == "1/2" and two[0] == "2/2" and one[1] != two[1]
