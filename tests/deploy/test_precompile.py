import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from fullgraph.deploy import DeployError
from fullgraph.deploy import precompile as pre
from fullgraph.deploy._common import environment
from fullgraph.serving import OutOfMemoryError
from tests.deploy._models import Linears, linears
from tests.deploy._threads import threaded

ROOT = Path(__file__).resolve().parents[2]
needs_api = pytest.mark.skipif(pre.unsupported_reason() is not None, reason=pre.unsupported_reason() or "")

# The fresh process: load the file into a model of other weights and one of the saved weights, run both, then
# trace the model with Dynamo (backend="eager") as a control that the counters see a trace when there is one.
CHILD = """
import json, sys, time
start = time.perf_counter()
import torch
from fullgraph.deploy.precompile import load_precompiled
from fullgraph.deploy import DeployError
from tests.deploy._models import Linears
from torch._dynamo.utils import counters

folder = sys.argv[1]
model = Linears().eval()
model.load_state_dict(torch.load(folder + "/weights.pt"))
x = torch.load(folder + "/x.pt")
imported = time.perf_counter()
loaded = load_precompiled(folder + "/linears.fgpre", model)
y = loaded(x)
first = time.perf_counter()
other = Linears().eval()
y_other = load_precompiled(folder + "/linears.fgpre", other)(x)
report = {"import_s": imported - start, "load_and_first_call_s": first - imported}
report["counters"] = {k: dict(v) for k, v in counters.items()}
with torch.no_grad():
    report["err"] = (y - model(x)).abs().max().item()
    report["err_other_weights"] = (y_other - other(x)).abs().max().item()
    report["expected"] = torch.load(folder + "/y.pt").sub(y).abs().max().item()
try:
    loaded(torch.randn(5, 8))
except DeployError as e:
    report["other_shape"] = str(e)
torch.compile(model, backend="eager", fullgraph=True)(x)
report["control_unique_graphs"] = counters["stats"]["unique_graphs"]
print(json.dumps(report))
"""


@needs_api
@pytest.mark.slow
def test_a_fresh_process_runs_the_precompiled_model_without_tracing_or_compiling(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-save"))
    model, (x,) = linears()
    with torch.no_grad():
        torch.save(model(x), tmp_path / "y.pt")
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.save(x, tmp_path / "x.pt")
    meta = pre.save_precompiled(model, (x,), tmp_path / "linears.fgpre")
    assert (meta.model, meta.signature) == ("tests.deploy._models.Linears", "4x8:float32@cpu")
    assert (tmp_path / "linears.fgpre").stat().st_mode & 0o777 == 0o644
    assert not list(tmp_path.glob(".linears.fgpre.tmp-*")), "the private work folder was left behind"

    empty = tmp_path / "inductor-load"  # nothing compiled is there: all of it must come from the file
    child_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(empty), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], cwd=tmp_path, env=child_env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    took = report["load_and_first_call_s"]
    print(f"fresh process: import {report['import_s']:.2f} s, load + first call {took:.2f} s")
    counters = report["counters"]
    assert counters.get("stats", {}).get("unique_graphs", 0) == 0, counters  # Dynamo traced nothing
    assert not counters.get("frames"), counters
    assert counters.get("inductor", {}).get("fxgraph_cache_miss", 0) == 0, counters  # Inductor compiled nothing
    assert counters.get("aot_autograd", {}).get("autograd_cache_miss", 0) == 0, counters
    assert report["control_unique_graphs"] >= 1, report  # the counter does see a trace when one happens
    assert report["err"] < 1e-5 and report["expected"] < 1e-5, report
    assert report["err_other_weights"] < 1e-5, report  # the weights come from the model given, not the file
    assert "precompiled for inputs 4x8:float32@cpu, not 5x8:float32@cpu" in report["other_shape"], report
    assert "size mismatch" in report["other_shape"], report


@needs_api
@pytest.mark.slow
def test_a_declared_dynamic_dim_serves_other_sizes_and_refuses_outside_its_range(tmp_path, monkeypatch):
    # One of torch's own modules: torch.compile wraps their bound forward in a closure that torch cannot serialize,
    # so the model must be an input of what is compiled, not part of it.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(4, 8)
    meta = pre.save_precompiled(model, (x,), tmp_path / "dyn.fgpre", dynamic={"input": {0: (2, 64)}})
    assert meta.dynamic == {"input": {"0": [2, 64]}} and meta.model == "torch.nn.modules.container.Sequential"
    assert not hasattr(x, "_dynamo_dynamic_indices"), "the caller's tensor was marked dynamic"
    other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).eval()
    loaded = pre.load_precompiled(tmp_path / "dyn.fgpre", other)
    z = torch.randn(17, 8)
    with torch.no_grad():
        assert (loaded(z) - other(z)).abs().max().item() < 1e-5
    with pytest.raises(DeployError, match=r"not 65x8:float32@cpu: guard 2 <= input\.size\(\)\[0\] <= 64"):
        loaded(torch.randn(65, 8))


def forge(path: Path, payload: bytes = b"compiled", **changes) -> Path:
    """A precompiled file as save_precompiled writes it, with header fields changed; its payload is never
    unpickled (every test below is refused before that)."""
    meta = pre.PrecompiledMeta(
        **environment(),
        python=platform.python_version(),
        model="tests.deploy._models.Linears",
        signature="4x8:float32@cpu",
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_bytes=len(payload),
    )
    header = json.dumps({**asdict(meta), **changes}).encode() + b"\n"
    path.write_bytes(pre.MAGIC + header + payload)
    path.chmod(0o644)
    return path


@needs_api
def test_a_file_from_another_torch_or_python_is_refused_naming_both(tmp_path):
    path = forge(tmp_path / "old.fgpre", torch="2.11.0+cu128", python="3.8.10")  # neither the CPU's nor the GPU's
    with pytest.raises(DeployError) as e:
        pre.load_precompiled(path, Linears())
    msg = str(e.value)
    assert f"torch 2.11.0+cu128 there, {torch.__version__} here" in msg
    assert f"python 3.8.10 there, {platform.python_version()} here" in msg
    assert "precompile the model again in this environment" in msg and "\n" not in msg


@needs_api
def test_another_model_class_or_other_inputs_are_refused(tmp_path):
    path = forge(tmp_path / "m.fgpre")
    with pytest.raises(DeployError, match=r"model tests\.deploy\._models\.Linears there, torch\.nn\..*Linear here"):
        pre.load_precompiled(path, torch.nn.Linear(8, 4))
    with pytest.raises(DeployError, match=r"inputs 4x8:float32@cpu there, 2x8:float32@cpu here"):
        pre.load_precompiled(path, Linears(), signature="2x8:float32@cpu")


@needs_api
def test_damaged_foreign_or_writable_files_are_refused_before_unpickling(tmp_path):
    path = forge(tmp_path / "m.fgpre")
    path.write_bytes(path.read_bytes()[:-3])  # truncated payload
    with pytest.raises(DeployError, match="damaged or truncated"):
        pre.load_precompiled(path, Linears())
    other = tmp_path / "cache.bin"
    other.write_bytes(b"FULLGRAPH-CACHE\n{}\n")
    other.chmod(0o644)
    with pytest.raises(DeployError, match="not a fullgraph precompiled file"):
        pre.load_precompiled(other, Linears())
    shared = forge(tmp_path / "shared.fgpre")
    shared.chmod(0o666)
    with pytest.raises(DeployError, match="writable by group and others"):
        pre.load_precompiled(shared, Linears())
    bad = forge(tmp_path / "bad.fgpre", format=99)
    with pytest.raises(DeployError, match="has precompiled format 99, this fullgraph reads 1"):
        pre.read_precompiled(bad)


def test_an_older_torch_is_named_with_the_version_needed(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
    reason = pre.unsupported_reason()
    assert reason is not None and "needs torch 2.11 or later" in reason and "this is torch 2.10.0+cu128" in reason
    with pytest.raises(DeployError, match=r"needs torch 2\.11 or later"):
        pre.save_precompiled(Linears(), (torch.randn(4, 8),), "unused.fgpre")


# ---- many threads, out of memory (issue 31) ---------------------------------------------------------------------


@needs_api
@pytest.mark.slow
def test_a_precompiled_model_called_from_8_threads_gives_each_caller_its_own_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, (x,) = linears()
    pre.save_precompiled(model, (x,), tmp_path / "m.fgpre")
    loaded = pre.load_precompiled(tmp_path / "m.fgpre", model)
    inputs = [torch.randn(4, 8) for _ in range(16)]
    cold = threaded(loaded, inputs[:8], rounds=1)  # the first calls, all at once
    refs = [loaded(x) for x in inputs]
    warm = threaded(loaded, inputs, rounds=25)
    for got in (cold, warm):
        assert got["exceptions"] == [] and got["calls"] == (8 if got is cold else 16 * 25)
        assert [i for i, out in got["outputs"] if not torch.equal(out, refs[i])] == []


class OneBuffer:
    """A stand-in for precompiled code that replays a CUDA graph: every call writes its result into the same
    output memory and returns it (as torch's CUDA-graph trees do), slowly enough for threads to overlap."""

    def __init__(self) -> None:
        self.out = torch.zeros(4, 8)

    def __call__(self, model, x):
        self.out.copy_(x * 2)
        time.sleep(0.0005)
        return self.out


def graphed_stand_in(tmp_path, compiled) -> pre.PrecompiledModel:
    meta = pre.PrecompiledMeta(**environment(), python=platform.python_version(), model="tests.deploy._models.Linears",
                               signature="4x8:float32@cpu", cuda_graphs=True)  # fmt: skip
    return pre.PrecompiledModel(str(tmp_path / "m.fgpre"), meta, Linears(), compiled)


@needs_api
def test_outputs_of_replayed_graphs_are_copied_out_under_the_models_lock(tmp_path):
    fake = OneBuffer()
    loaded = graphed_stand_in(tmp_path, fake)
    inputs = [torch.randn(4, 8) for _ in range(16)]
    got = threaded(loaded, inputs, rounds=10)
    assert got["exceptions"] == [] and got["calls"] == 160
    assert [i for i, out in got["outputs"] if not torch.equal(out, inputs[i] * 2)] == []
    assert all(out is not fake.out for _, out in got["outputs"])
    with loaded.borrow(inputs[0]) as out:  # no copy: the graph's own output, valid while the lock is held
        assert out is fake.out and torch.equal(out, inputs[0] * 2)


@needs_api
def test_out_of_memory_in_a_precompiled_call_names_the_inputs(tmp_path):
    def out_of_memory(model, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    loaded = graphed_stand_in(tmp_path, out_of_memory)
    with pytest.raises(OutOfMemoryError, match=r"m\.fgpre: out of GPU memory for inputs 64x8:float32@cpu; call it"):
        loaded(torch.randn(64, 8))
    assert not loaded._guard.lock._is_owned()  # the lock is released for the next call


@needs_api
@pytest.mark.gpu
def test_a_reduce_overhead_file_replays_one_cuda_graph_from_many_threads(tmp_path, monkeypatch):
    # torch applies no CUDA graph to loaded code unless triton.cudagraphs is on as it loads (precompile docstring):
    # such a file runs behind GraphedCall, which captures at the second call of a signature and replays after.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.manual_seed(0)
    model = Linears().eval().cuda()
    x = torch.randn(4, 8, device="cuda")
    meta = pre.save_precompiled(model, (x,), tmp_path / "m.fgpre", mode="reduce-overhead")
    assert meta.cuda_graphs
    loaded = pre.load_precompiled(tmp_path / "m.fgpre", model)
    inputs = [torch.randn(4, 8, device="cuda") for _ in range(16)]
    double = Linears().double().cuda()
    double.load_state_dict(model.state_dict())
    with torch.no_grad():
        refs = [double(x.double()).float() for x in inputs]
    outs = [loaded(x) for x in inputs[:3]]
    assert len(loaded.graphs.graphs) == 1 and loaded.graphs.skipped == {}
    assert outs[1].data_ptr() != outs[2].data_ptr()  # each caller's own copy, not the graph's output memory
    got = threaded(loaded, inputs, rounds=20)
    assert got["exceptions"] == [] and got["calls"] == 16 * 20
    worst = max((out - refs[i]).abs().max().item() / refs[i].abs().max().item() for i, out in got["outputs"])
    assert worst < 1e-2  # TF32 may be on; a wrong caller's output would be off by O(1)
    with pytest.raises(DeployError, match="was precompiled for inputs 4x8:float32@cuda"):
        loaded(torch.randn(5, 8, device="cuda"))


@needs_api
def test_a_second_precompile_at_another_size_stays_static(tmp_path, monkeypatch):
    # Every precompile compiles one function; under automatic dynamic shapes the second (another size) came out
    # dynamic, and its guard then took sizes it was not made for (found by the fleet tests after the others ran).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = Linears().eval()
    pre.save_precompiled(model, (torch.randn(4, 8),), tmp_path / "a.fgpre")
    meta = pre.save_precompiled(model, (torch.randn(6, 8),), tmp_path / "b.fgpre")
    assert meta.signature == "6x8:float32@cpu" and meta.dynamic == {}
    loaded = pre.load_precompiled(tmp_path / "b.fgpre", model)
    x = torch.randn(6, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    with pytest.raises(DeployError, match="was precompiled for inputs 6x8:float32@cpu, not 5x8:float32@cpu"):
        loaded(torch.randn(5, 8))


class Printing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        print("mean", y.mean().item())  # a graph break (a tensor read back to Python)
        return y * 2


@needs_api
@pytest.mark.slow
def test_what_cannot_be_precompiled_says_why_and_which_route_remains(tmp_path):
    with pytest.raises(pre.NotPrecompilable, match=r"could not precompile Printing in one graph: .*fullgraph doctor"):
        pre.save_precompiled(Printing().eval(), (torch.randn(2, 8),), tmp_path / "p.fgpre")
    pytest.importorskip("transformers")
    from tests.deploy._models import tiny_bert

    try:  # transformers' BERT: guards torch 2.13 cannot write to a file
        pre.save_precompiled(tiny_bert(), (torch.randint(0, 1000, (2, 8)),), tmp_path / "b.fgpre")
    except pre.NotPrecompilable as e:
        said = str(e)
    else:
        pytest.skip(f"torch {torch.__version__} saves BERT's guards: the message has nothing to say here")
    assert f"torch {torch.__version__} cannot save BertModel's compiled code" in said and "guard" in said
    assert "AOT package (fullgraph.deploy.export)" in said and "fullgraph doctor" not in said
    assert not list(tmp_path.iterdir())  # nothing written


@needs_api
def test_a_triton_kernel_defined_inside_a_function_stops_the_save_by_name(tmp_path):
    # torch saves every kernel of the process's side table as (module, name) and its loader imports them back: a
    # kernel built inside a function made the file unloadable ("module has no attribute"; H200, gemm_gelu, 2.11)
    triton = pytest.importorskip("triton")
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    def build():
        @triton.jit
        def scale_rows(x_ptr):
            pass

        return scale_rows

    local = build()
    idx = kernel_side_table.add_kernel(local)
    try:
        with pytest.raises(pre.NotPrecompilable, match=r"finds nothing for tests\.deploy\.test_precompile\."
                           r"test_a_triton_kernel_defined_inside_a_function_stops_the_save_by_name\.<locals>\."
                           r"build\.<locals>\.scale_rows \(defined inside a function"):  # fmt: skip
            pre.save_precompiled(Linears().eval(), (torch.randn(2, 8),), tmp_path / "m.fgpre")
        assert not list(tmp_path.iterdir())
    finally:  # the side table is the process's: later tests must not inherit the entry
        kernel_side_table.id_to_kernel.pop(idx, None)
        kernel_side_table.kernel_to_id.pop(local, None)
    meta = pre.save_precompiled(Linears().eval(), (torch.randn(2, 8),), tmp_path / "m.fgpre")  # module-level: fine
    assert meta.model.endswith("Linears")
