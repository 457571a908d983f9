import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

import fullgraph
from fullgraph import env
from fullgraph.compile.graphs import GraphedCall
from fullgraph.deploy import DeployError, _probe, build, direct, export, inspect_package, load, package, probe
from fullgraph.errors import UsageError
from fullgraph.serving import OutOfMemoryError, OwnerThread
from tests.deploy._models import MLP
from tests.deploy._threads import threaded

CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"


def fake_package(path: Path, calls: tuple[str, ...] = (), **meta) -> Path:
    """A zip shaped like an AOTInductor package (what inspect_package checks), with no code that could run;
    `calls` names the custom ops its extern-node JSON lists (what the proxy executor would call in Python)."""
    aoti = {"AOTI_DEVICE_KEY": "cpu", "AOTI_PLATFORM": sys.platform, "AOTI_COMPUTE_CAPABILITY": "", **meta}
    root = path.stem
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{root}/archive_format", "pt2")
        z.writestr(f"{root}/data/aotinductor/model/abc.wrapper.so", os.urandom(256))
        z.writestr(f"{root}/data/aotinductor/model/abc.wrapper_metadata.json", json.dumps(aoti))
        if calls:
            nodes = [{"name": f"buf{i}", "node": {"target": op, "inputs": []}} for i, op in enumerate(calls)]
            z.writestr(f"{root}/data/aotinductor/model/abc.wrapper.json", json.dumps({"nodes": nodes}))
    path.chmod(0o644)
    return path


def probe_with(monkeypatch, code: str) -> None:
    """Make the probe child run `code` instead of loading the package."""
    argv = [sys.executable, "-X", "faulthandler", "-c", code]
    monkeypatch.setattr(_probe, "probe_argv", lambda path, index, ops=(), modules=(): argv)


@pytest.mark.slow
def test_exported_package_with_dynamic_batch_matches_eager_at_three_sizes(tmp_path):
    model = MLP(dim=24, hidden=40, out=7).eval()
    path = export(model, (torch.randn(5, 24),), tmp_path / "mlp.pt2", dynamic={"x": {0: (1, 64)}})
    assert Path(path).stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no work folder left behind
    loaded = load(path)
    assert loaded.inputs == "5x24:float32@cpu"
    assert probe(path)["cached"] is True  # load probed it once; the verdict is kept by content
    with torch.no_grad():
        for batch in (1, 3, 64):
            x = torch.randn(batch, 24)
            torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_crashing_probe_is_reported_and_remembered(tmp_path, monkeypatch):
    path = fake_package(tmp_path / "m.pt2")
    probe_with(monkeypatch, CRASH)
    with pytest.raises(DeployError) as e:
        load(path)
    msg = str(e.value)
    assert f"exit -{int(signal.SIGSEGV)}, SIGSEGV" in msg
    assert "Fatal Python error: Segmentation fault" in msg
    assert "not loaded here" in msg and "\n" not in msg
    # The verdict belongs to the file's content: a second load does not probe again (this probe would pass).
    probe_with(monkeypatch, "pass")
    with pytest.raises(DeployError, match="verdict cached"):
        load(path)
    # Another file (other bytes) gets its own probe.
    verdict = probe(fake_package(tmp_path / "n.pt2"))
    assert verdict["ok"] and not verdict["cached"]


def test_a_crashing_probe_leaves_no_unpacked_package_behind(tmp_path, monkeypatch):
    # torch's loader unpacks a package into TMPDIR/aotinductor_*, removed only when the loader is destroyed: a child
    # that crashes would leave it. The child here makes such a folder, says where its Inductor cache is, and dies.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    report = tmp_path / "report.txt"
    code = (
        "import os, tempfile; d = tempfile.mkdtemp(prefix='aotinductor_'); open(os.path.join(d, 'm.so'), 'wb');"
        f"open({str(report)!r}, 'w').write(d + '\\n' + os.environ['TORCHINDUCTOR_CACHE_DIR']); {CRASH}"
    )
    probe_with(monkeypatch, code)
    verdict = probe(fake_package(tmp_path / "m.pt2"))
    assert not verdict["ok"] and verdict["rc"] == -signal.SIGSEGV
    unpacked, inductor_cache = report.read_text().splitlines()
    assert not os.path.exists(unpacked)
    assert sorted(os.listdir(tmp)) == []  # the scratch folder is gone with what the child left in it
    assert inductor_cache == str(tmp / f"torchinductor_{os.environ.get('USER') or _probe._user()}")  # kept: ours


def test_a_probe_that_fails_with_a_python_error_is_probed_again(tmp_path, monkeypatch):
    path = fake_package(tmp_path / "m.pt2")
    probe_with(monkeypatch, "raise SystemExit('no module named foo')")
    with pytest.raises(DeployError, match=r"failed in a probe process \(exit 1: no module named foo\)"):
        load(path)
    probe_with(monkeypatch, "pass")
    verdict = probe(path)  # the environment may be fixed by now: not remembered
    assert verdict["ok"] and not verdict["cached"]
    assert probe(path)["cached"]  # a pass is


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\x7fELF not a zip at all", "not a readable package"),
        (None, "not a readable package"),  # a real-looking package cut in half
    ],
)
def test_damaged_files_are_refused_before_anything_runs(tmp_path, monkeypatch, content, why):
    probe_with(monkeypatch, CRASH)  # never reached
    path = tmp_path / "bad.pt2"
    if content is None:
        data = fake_package(tmp_path / "whole.pt2").read_bytes()
        content = data[: len(data) // 2]
    path.write_bytes(content)
    path.chmod(0o644)
    with pytest.raises(DeployError, match=why):
        load(path)
    with pytest.raises(DeployError, match=why):  # the top-level name is the same loader
        fullgraph.load(path)


def test_a_zip_that_is_not_an_aoti_package_is_refused(tmp_path):
    path = tmp_path / "plain.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("plain/archive_format", "pt2")
        z.writestr("plain/data/weights.bin", b"0" * 10)
    with pytest.raises(DeployError, match="holds no AOTInductor model"):
        inspect_package(path)


def test_packages_built_for_another_torch_or_device_are_refused(tmp_path):
    with pytest.raises(DeployError, match=re.escape(f"torch 2.0.1 there, {torch.__version__} here")):
        inspect_package(fake_package(tmp_path / "t.pt2", fullgraph_torch="2.0.1"))
    with pytest.raises(DeployError, match=r"(a CUDA GPU there, none here|compute capability 10 there)"):
        inspect_package(fake_package(tmp_path / "g.pt2", AOTI_DEVICE_KEY="cuda", AOTI_COMPUTE_CAPABILITY="10"))


def test_a_package_whose_output_types_cannot_be_imported_is_refused_by_name(tmp_path, monkeypatch):
    probe_with(monkeypatch, CRASH)  # never reached
    path = fake_package(tmp_path / "m.pt2", fullgraph_pytree=json.dumps({"nomod_xyz.Output": "nomod_xyz"}))
    with pytest.raises(DeployError, match=r"returns nomod_xyz\.Output, which nomod_xyz defines, and importing it fail"):
        load(path)


@pytest.mark.slow
def test_a_transformers_model_exported_loads_in_a_process_that_never_imports_transformers(tmp_path):
    # A transformers model returns a ModelOutput, a pytree node that only importing transformers registers: torch's
    # loader could not rebuild the outputs in the probe child ("Deserializing ...SequenceClassifierOutput in pytree
    # is not registered") nor in a server that imports only fullgraph. Its users also call it by keyword.
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, num_labels=3)  # fmt: skip
    model = transformers.BertForSequenceClassification(config).eval()
    ids, mask = torch.randint(1, 99, (2, 7)), torch.ones(2, 7, dtype=torch.int64)
    mask[0, 5:] = 0
    path = export(model, (), tmp_path / "bert.pt2", kwargs={"attention_mask": mask, "input_ids": ids})  # a dict
    _, meta = inspect_package(path)
    assert json.loads(meta["fullgraph_pytree"]) == {
        "transformers.modeling_outputs.SequenceClassifierOutput": "transformers.modeling_outputs"
    }
    assert json.loads(meta["fullgraph_args"]) == ["input_ids", "attention_mask"]
    with torch.no_grad():
        torch.save({"ids": ids, "mask": mask, "logits": model(input_ids=ids, attention_mask=mask).logits},
                   tmp_path / "io.pt")  # fmt: skip
    code = f"""
import sys, torch, fullgraph
assert "transformers" not in sys.modules
io = torch.load({str(tmp_path / "io.pt")!r})
m = fullgraph.load({path!r})
out = m(input_ids=io["ids"], attention_mask=io["mask"])
print(type(out).__name__, (out.logits - io["logits"]).abs().max().item())
try:
    m(io["ids"], mask=io["mask"])
except fullgraph.errors.UsageError as e:
    print(e)
"""
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    first, second = child.stdout.strip().splitlines()[-2:]
    kind, err = first.split()
    assert kind == "SequenceClassifierOutput" and float(err) < 1e-5
    assert "exported with inputs (input_ids, attention_mask); got 1 by position and mask by name" in second


def test_a_package_others_can_write_is_refused(tmp_path):
    path = fake_package(tmp_path / "m.pt2")
    path.chmod(0o646)
    with pytest.raises(DeployError, match="writable by others"):
        load(path)


def test_export_explains_data_dependent_control_flow(tmp_path):
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(DeployError) as e:
        export(Branchy(), (torch.randn(3),), tmp_path / "b.pt2")
    msg = str(e.value)
    assert "torch.export could not capture Branchy at tests/deploy/test_package.py:" in msg
    assert "(`return x * 2 if x.sum() > 0 else x - 1`)" in msg
    assert "fullgraph doctor" in msg
    assert not (tmp_path / "b.pt2").exists()


class KVCache:
    """An object holding tensors that no pytree registration knows, as transformers' DynamicCache."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys


def test_export_of_a_model_returning_an_unknown_object_names_it_and_the_fix(tmp_path):
    class WithCache(torch.nn.Module):
        def forward(self, x):
            return x * 2, KVCache(x + 1)

    with pytest.raises(DeployError) as e:
        export(WithCache(), (torch.randn(3),), tmp_path / "c.pt2")
    msg = str(e.value)
    assert "WithCache returns a KVCache, which a package cannot return: return tensors, tuples, lists or dicts" in msg
    assert "register tests.deploy.test_package.KVCache as a pytree node" in msg
    assert "export with use_cache=False" in msg and "fullgraph doctor" not in msg  # not a graph break
    assert not (tmp_path / "c.pt2").exists()


def test_export_checks_its_arguments_before_tracing(tmp_path):
    model, x = MLP(), torch.randn(2, 8)
    with pytest.raises(UsageError, match=r"ends in \.pt2"):
        export(model, (x,), tmp_path / "m.zip")
    with pytest.raises(UsageError, match="'y', which is not an input; inputs: x"):
        export(model, (x,), tmp_path / "m.pt2", dynamic={"y": {0: (1, 8)}})
    with pytest.raises(UsageError, match="x has 2 dims, so dim 2 is out of range"):
        export(model, (x,), tmp_path / "m.pt2", dynamic={"x": {2: (1, 8)}})


def test_a_package_calling_an_unregistered_custom_op_is_refused_before_the_probe(tmp_path, monkeypatch):
    probe_with(monkeypatch, CRASH)  # never reached
    path = fake_package(tmp_path / "m.pt2", calls=("fullgraph::rms_norm", "nosuchlib::fused_thing"))
    with pytest.raises(DeployError) as e:
        load(path)
    msg = str(e.value)
    assert "nothing imported here registers (nosuchlib::fused_thing)" in msg
    assert "probe" not in msg and "rms_norm" not in msg  # fullgraph's own are registered by load


def test_a_cpu_package_calling_our_triton_kernels_needs_the_interpreter(tmp_path, monkeypatch):
    probe_with(monkeypatch, "raise SystemExit('probed')")
    kernels = fake_package(tmp_path / "k.pt2", calls=("fullgraph::rms_norm", "fullgraph::modulate"))
    sdpa = fake_package(tmp_path / "s.pt2", calls=("fullgraph::sdpa_math",))  # one of ours, not a Triton kernel
    monkeypatch.setattr(env, "triton_runs_on", lambda device: (False, "CPU tensors need TRITON_INTERPRET=1"))
    with pytest.raises(DeployError) as e:
        load(kernels)
    msg = str(e.value)
    assert "Triton kernels as opaque ops (fullgraph::modulate, fullgraph::rms_norm" in msg
    assert "cannot run on cpu here: CPU tensors need TRITON_INTERPRET=1" in msg and "--ops none" in msg
    with pytest.raises(DeployError, match=r"failed in a probe process \(exit 1: probed\)"):
        load(sdpa)  # passed the op checks: the probe ran
    monkeypatch.setattr(env, "triton_runs_on", lambda device: (True, "TRITON_INTERPRET=1"))
    with pytest.raises(DeployError, match=r"failed in a probe process \(exit 1: probed\)"):
        load(kernels)


def test_cuda_graphs_on_a_cpu_package_are_refused_before_the_probe(tmp_path, monkeypatch):
    probe_with(monkeypatch, CRASH)  # reaching the probe would crash it: the refusal must come first
    with pytest.raises(UsageError, match=r"cuda_graphs=True: .*runs on cpu; CUDA graphs need a package exported"):
        load(fake_package(tmp_path / "m.pt2"), cuda_graphs=True)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"runners": 0}, r"runners=0: give how many model instances to keep, a positive int"),
        ({"runners": True}, r"runners=True: give how many"),
        ({"runners": 2, "cuda_graphs": True}, r"runners=2 with cuda_graphs=True: the replayed model runs single"),
        ({"serial": True, "cuda_graphs": True}, r"serial=True with cuda_graphs=True \(which runs it single-threaded"),
        ({"serial": True, "runners": 2}, r"serial=True with runners=2: serial runs one model instance on one thread"),
    ],
)
def test_bad_runners_are_refused_before_the_file_is_read(tmp_path, kwargs, says):
    with pytest.raises(UsageError, match=says):
        load(tmp_path / "absent.pt2", **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("release_gil", [False, True], ids=["torch-loader", "gil-released"])
def test_a_cuda_package_replays_from_a_cuda_graph_and_matches_its_plain_load(tmp_path, release_gil):
    model = MLP(dim=64, hidden=128, out=16).cuda().eval()
    path = export(model, (torch.randn(4, 64, device="cuda"),), tmp_path / "mlp.pt2")
    try:
        plain = load(path)
    except DeployError as e:  # the H200 image's loader crash (DESIGN.md, anchors) stops this test, by name
        pytest.skip(f"this torch cannot load AOTInductor packages here: {e}")
    graphed = load(path, cuda_graphs=True, release_gil=release_gil)
    assert isinstance(graphed.graphs.fn, direct.DirectCall) == release_gil
    for _ in range(4):  # first call runs plainly, the second captures, later ones replay
        x = torch.randn(4, 64, device="cuda")
        torch.testing.assert_close(graphed(x), plain(x))
    assert len(graphed.graphs.graphs) == 1 and not graphed.graphs.skipped


class NormFirst(torch.nn.Module):
    """Our RMSNorm's Triton kernel first, then a matmul: the package's first launch goes through CUDA's driver API."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.proj = torch.nn.Linear(dim, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(fullgraph.ops.rms_norm(x, self.weight))


@pytest.mark.gpu
@pytest.mark.parametrize("release_gil", [False, True], ids=["torch-loader", "gil-released"])
def test_a_package_whose_first_kernel_is_triton_runs_from_a_fresh_thread(tmp_path, release_gil):
    # H200, torch 2.11: every call from a thread other than the loading one failed ("CUDA driver error: invalid
    # device context") until the package bound the device's context on each calling thread (bind_cuda_context).
    model = NormFirst().cuda().eval()
    with fullgraph.ops.policy(rms_norm="kernel"):
        path = export(model, (torch.randn(4, 64, device="cuda"),), tmp_path / "norm.pt2")
    loaded = load(path, probe_first=False, release_gil=release_gil)
    inputs = [torch.randn(4, 64, device="cuda") for _ in range(8)]
    with torch.no_grad(), fullgraph.ops.policy(rms_norm="native"):
        refs = [model(x) for x in inputs]
    got = threaded(loaded, inputs, rounds=5)  # eight fresh threads, none of which loaded the package
    assert got["exceptions"] == [] and got["calls"] == 8 * 5
    for i, out in got["outputs"]:
        torch.testing.assert_close(out, refs[i], rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "options",
    [{"serial": True}, {"release_gil": True, "runners": 2}, {"release_gil": True, "serial": True}],
    ids=["serial", "gil-released-2-runners", "gil-released-serial"],
)
def test_a_cuda_package_from_threads_on_their_own_streams_gives_each_its_output(tmp_path, options):
    # serial=True: each call runs on its caller's stream from the package's own thread, so calls made on different
    # streams run on the GPU together; right only if a call's buffers are its own (the runtime allocates them
    # through the caching allocator) and the owner follows each caller's stream
    model = MLP(dim=1024, hidden=4096, out=1024).cuda().eval()
    path = export(model, (torch.randn(256, 1024, device="cuda"),), tmp_path / "wide.pt2")
    loaded = load(path, probe_first=False, **options)
    inputs = [torch.randn(256, 1024, device="cuda") for _ in range(8)]
    with torch.no_grad():
        refs = [model(x) for x in inputs]
    torch.cuda.synchronize()
    wrong, errors, barrier = [], [], threading.Barrier(8)

    def work(t: int) -> None:
        stream = torch.cuda.Stream()
        barrier.wait()
        try:
            for _ in range(20):
                with torch.cuda.stream(stream):
                    out = loaded(inputs[t])
                stream.synchronize()
                if not torch.allclose(out, refs[t], rtol=1e-3, atol=1e-3):
                    wrong.append(t)
        except Exception as e:  # counted: every thread's failure is reported
            errors.append(repr(e))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=300)
    assert errors == [] and wrong == []


def test_a_presets_inductor_options_reach_the_package_less_what_a_package_cannot_use():
    assert build.aot_options(None) == {}
    perception = build.aot_options("perception")
    assert perception["shape_padding"] is True
    assert not set(build.AOT_DROPPED) & set(perception)  # reduce-overhead's CUDA graphs stay out
    edge = build.aot_options("edge")
    assert edge["max_autotune"] is True and edge["freezing"] is True and "cpp_wrapper" not in edge
    assert build.aot_options(None, "max-autotune-no-cudagraphs")["max_autotune"] is True
    with pytest.raises(UsageError, match="unknown preset 'egde'"):
        build.aot_options("egde")


@pytest.mark.slow
def test_a_package_built_with_a_preset_records_it_and_matches_eager(tmp_path):
    model = MLP(dim=16, hidden=24, out=5).eval()
    x = torch.randn(3, 16)
    path = export(model, (x,), tmp_path / "fusion.pt2", preset="fusion")
    loaded = load(path, probe_first=False)
    assert loaded.metadata["fullgraph_preset"] == "fusion"
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)


# ---- faults and threads (issue 31) -------------------------------------------------------------------------------

# What AOTInductor's runtime raises on the H200 for inputs its checks refuse (and for an out-of-memory inside it).
RUN_FUNC = "run_func_( container_handle_, input_handles.data(), ...) API call failed at model_container_runner.cpp"


def raising(error: BaseException):
    def model(*args, **kwargs):
        raise error

    return model


def stand_in(model, metadata=None) -> package.LoadedPackage:
    """A LoadedPackage around `model`, recording the inputs `export` records for a batch-4 MLP."""
    meta = {"fullgraph_inputs": "4x8:float32@cpu", "fullgraph_dynamic": "{}", "fullgraph_flat_dynamic": "{}"}
    return package.LoadedPackage("/pkgs/mlp.pt2", "0" * 64, {**meta, **(metadata or {})}, model)


@pytest.mark.slow
def test_inputs_that_do_not_fit_are_a_usage_error_naming_the_exported_shapes(mlp_package):
    path, _ = mlp_package
    loaded = load(path, probe_first=False)
    with pytest.raises(UsageError, match=r"do not fit .*mlp\.pt2 .*exported for 4x8:float32@cpu, every dim fixed"):
        loaded(torch.randn(8, 8))


@pytest.mark.parametrize("graphed", [False, True], ids=["plain", "cuda_graphs"])
def test_a_runtimes_generic_error_is_told_apart_by_the_recorded_inputs(graphed):
    model = raising(RuntimeError(RUN_FUNC))
    loaded = stand_in(GraphedCall(model) if graphed else model)  # GraphedCall: the path of load(cuda_graphs=True)
    with pytest.raises(UsageError) as e:
        loaded(torch.randn(8, 8))
    msg = str(e.value)
    assert "these inputs (8x8:float32@cpu) do not fit /pkgs/mlp.pt2 (dim 0 of input 0 is 8, exported fixed at 4)" in msg
    assert "exported for 4x8:float32@cpu, every dim fixed" in msg and "\n" not in msg
    with pytest.raises(RuntimeError, match=r"run_func_") as raw:  # inputs that fit: the failure is something else
        loaded(torch.randn(4, 8))
    assert not isinstance(raw.value, UsageError)
    dynamic = stand_in(
        model, {"fullgraph_dynamic": '{"x": {"0": [1, 64]}}', "fullgraph_flat_dynamic": '{"0": {"0": [1, 64]}}'}
    )
    with pytest.raises(RuntimeError, match=r"run_func_"):
        dynamic(torch.randn(9, 8))  # within the declared range
    with pytest.raises(UsageError, match=r"dim 0 of input 0 is 65, outside its declared range 1\.\.64"):
        dynamic(torch.randn(65, 8))


def test_out_of_memory_in_a_package_call_names_the_inputs(monkeypatch):
    loaded = stand_in(raising(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    with pytest.raises(OutOfMemoryError, match=r"^/pkgs/mlp\.pt2: out of GPU memory for inputs 4x8:float32@cpu; "):
        loaded(torch.randn(4, 8))
    # On a GPU the runtime passes an out-of-memory on as its generic error: torch's count of them tells.
    counts = iter([0, 1])
    monkeypatch.setattr(package, "cuda_device", lambda args, kwargs: torch.device("cuda", 0))
    monkeypatch.setattr(package.OomCount, "read", staticmethod(lambda device: next(counts)))
    generic = stand_in(raising(RuntimeError(RUN_FUNC)))
    generic._ooms.start(torch.device("cuda", 0))
    with pytest.raises(OutOfMemoryError, match=r"out of GPU memory for inputs 4x8:float32@cpu"):
        generic(torch.randn(4, 8))


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"runners": 1}, {"runners": 3}, {"serial": True}], ids=["1", "3", "serial"])
def test_a_package_called_from_8_threads_gives_each_caller_its_own_output(mlp_package, options):
    path, _ = mlp_package
    loaded = load(path, probe_first=False, **options)  # runners 3: calls of several threads run at once
    inputs = [torch.randn(4, 8) for _ in range(16)]
    cold = threaded(loaded, inputs[:8], rounds=1)  # the first calls, all at once
    with torch.no_grad():
        refs = [loaded(x) for x in inputs]
    warm = threaded(loaded, inputs, rounds=25)
    for got in (cold, warm):
        assert got["exceptions"] == [] and got["calls"] > 0
        assert [i for i, out in got["outputs"] if not torch.equal(out, refs[i])] == []


def test_serial_opens_the_runtime_single_threaded_and_runs_every_call_on_one_thread(mlp_package, monkeypatch):
    opened, inside, most, threads = [], [0], [0], set()
    real = package.open_package

    def open_package(path, device_index, single_threaded=False, runners=1, **rest):
        opened.append(single_threaded)
        model = real(path, device_index, single_threaded=single_threaded, runners=runners, **rest)

        def run(*args):  # counts the calls inside the runtime at once
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            threads.add(threading.get_ident())
            time.sleep(0.002)  # lets the other threads in, were the lock missing
            try:
                return model(*args)
            finally:
                inside[0] -= 1

        return run

    monkeypatch.setattr(package, "open_package", open_package)
    path, _ = mlp_package
    loaded = load(path, probe_first=False, serial=True)
    inputs = [torch.randn(4, 8) for _ in range(8)]
    with torch.no_grad():
        refs = [loaded(x) for x in inputs]
    got = threaded(loaded, inputs, rounds=5)
    assert opened == [True] and isinstance(loaded._model, OwnerThread)
    assert got["exceptions"] == [] and [i for i, out in got["outputs"] if not torch.equal(out, refs[i])] == []
    assert most[0] == 1  # 8 threads, never two calls inside the runtime together
    assert len(threads) == 1 and threading.get_ident() not in threads  # the package's own thread ran them all
    pooled = load(path, probe_first=False)  # the default keeps the runtime's pool
    assert opened == [True, False] and not isinstance(pooled._model, OwnerThread)


@pytest.mark.slow
def test_token_ids_past_a_table_are_refused_by_name_instead_of_aborting_the_process(tmp_path):
    from tests.deploy._models import Tokens

    model = Tokens().eval()
    ids, types, scale = torch.randint(3, 40, (2, 6)), torch.zeros(2, 6, dtype=torch.long), torch.ones(1)
    path = export(model, (ids, types, scale), tmp_path / "tokens.pt2")
    loaded = load(path, probe_first=False)
    meta = loaded.metadata
    assert json.loads(meta["fullgraph_index_ranges"]) == {"0": [0, 49], "1": [0, 1]}  # the float one indexes nothing
    assert json.loads(meta["fullgraph_int_values"]) == {"0": [int(ids.min()), int(ids.max())], "1": [0, 0]}
    types_past = torch.tensor([[0, 1, 5, 0, 1, 0], [1, 1, 0, 0, 0, 1]])
    with pytest.raises(UsageError, match=r"token_type_ids holds values 0 to 5, and \S*tokens.pt2 indexes a table "
                                         r"with it that takes 0 to 1: outside it the package's compiled code would "
                                         r"abort this process"):  # fmt: skip
        loaded(ids, types_past, scale)
    with pytest.raises(UsageError, match=r"input_ids holds values -1 to 10, .* a table with it that takes 0 to 49"):
        loaded(torch.arange(-1, 11).view(2, 6), types, scale)
    good = torch.randint(0, 50, (2, 6)), torch.randint(0, 2, (2, 6)), scale
    with torch.no_grad():
        torch.testing.assert_close(loaded(*good), model(*good))  # the process is alive, and in-range calls run
    assert load(path, probe_first=False, check_indices=False)._index_ranges == {}
    # `fullgraph load` draws its random ids from the example's values, so its own inputs stay inside the tables
    done = subprocess.run([sys.executable, "-m", "fullgraph", "load", str(path), "--reps", "2"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-1500:]


@pytest.mark.slow
def test_advanced_indexing_takes_negative_indices_as_python_does(tmp_path):
    from tests.deploy._models import Gather

    model = Gather().eval()
    path = export(model, (torch.tensor([0, 4, 2]),), tmp_path / "gather.pt2")
    loaded = load(path, probe_first=False)
    assert json.loads(loaded.metadata["fullgraph_index_ranges"]) == {"0": [-5, 4]}
    wrapped = torch.tensor([-5, -1, 3])
    with torch.no_grad():
        torch.testing.assert_close(loaded(wrapped), model(wrapped))  # -1 is the last row, in eager and here
    with pytest.raises(UsageError, match=r"idx holds values -6 to 1, .* takes -5 to 4"):
        loaded(torch.tensor([-6, 0, 1]))


def test_two_processes_updating_one_memo_keep_every_entry(tmp_path):
    memo = tmp_path / "cache" / _probe.PROBE_FILE
    code = (
        "import sys; from fullgraph.deploy import _probe\n"
        "for k in range(120): _probe.remember(sys.argv[1], f'{sys.argv[2]}-{k}', {'ok': True, 'k': k})\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", code, str(memo), f"p{n}"]) for n in range(4)]
    assert [c.wait(timeout=120) for c in children] == [0, 0, 0, 0]
    saved = json.loads(memo.read_text())
    missing = [f"p{n}-{k}" for n in range(4) for k in range(120) if f"p{n}-{k}" not in saved]
    assert missing == [] and len(saved) == 480
    assert sorted(p.name for p in memo.parent.iterdir()) == [_probe.PROBE_FILE, _probe.PROBE_FILE + ".lock"]


@pytest.mark.slow
def test_bench_load_runs_a_package_alone_and_behind_one_lock(mlp_package, tmp_path, capsys):
    from fullgraph.bench.results import read_csv
    from fullgraph.cli.main import main

    path, _ = mlp_package
    csv = tmp_path / "load.csv"
    kinds = "package,locked,nogil,nogil-serial"
    args = ["--callable", kinds, "--device", "cpu", "--threads", "1,8", "--seconds", "0.3"]
    assert main(["bench", "load", str(path), *args, "--csv", str(csv)]) == 0
    got = {(r.variant, r.metric): r.value for r in read_csv(csv)}
    kinds = ("package", "package, locked", "package, GIL released", "package, serial, GIL released")
    for variant in (f"{k}, warm" for k in kinds):
        assert got[(f"{variant}, 8 threads", "checked")] > 0 and got[(f"{variant}, 8 threads", "wrong")] == 0
        assert got[(f"{variant}, 8 threads", "exceptions")] == 0 and got[(f"{variant}, 8 threads", "calls")] > 0
    assert "package, locked" in capsys.readouterr().out


def test_builds_of_one_graph_take_turns_and_a_damaged_build_is_not_written(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    x = torch.randn(4, 8)
    programs = [torch.export.export(m.eval(), (x,)) for m in (MLP(), MLP())]  # two weights, one graph
    other = torch.export.export(MLP(dim=16).eval(), (torch.randn(4, 16),))
    assert build.build_key(programs[0], {}) == build.build_key(programs[1], {})
    assert build.build_key(programs[0], {}) != build.build_key(other, {})
    assert build.build_key(programs[0], {}) != build.build_key(programs[0], {"max_autotune": True})
    lock = Path(build.cache_dir()) / "builds" / f"{build.build_key(programs[0], {})[:32]}.lock"

    def held() -> bool:  # whether another process's build of this graph would wait now
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    with build.build_lock(programs[1], {}):
        assert held()
    assert not held()
    # what a build racing another wrote: an empty metadata JSON in an otherwise whole package
    damaged = fake_package(tmp_path / "damaged.pt2")
    with zipfile.ZipFile(damaged, "a") as z:
        z.writestr("damaged/data/aotinductor/model/abc.wrapper_metadata.json", "")
    with pytest.raises(DeployError, match=r"out\.pt2: the build wrote a damaged abc\.wrapper_metadata\.json .*not "
                       r"written\. Another process building the same model"):  # fmt: skip
        build._check_built(str(damaged), str(tmp_path / "out.pt2"))
