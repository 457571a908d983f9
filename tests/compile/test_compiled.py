import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

import fullgraph
import fullgraph.compile.presets
from fullgraph.compile import CompiledModel, CompileFallbackWarning, Preset, StrictRecompileError
from fullgraph.errors import UsageError
from tests.shared_wrapper import WrappedA, WrappedB


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Mlp(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.scale = 0.5

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


class Other(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Broken(nn.Module):
    """A break on a tensor's value in the middle of forward."""

    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:
            return y.relu()
        return y.sigmoid()


def test_an_unknown_option_is_refused_with_a_fix_before_anything_compiles():
    before = counters["frames"]["ok"]
    with pytest.raises(UsageError, match="did you mean 'freezing'"):
        fullgraph.compile(Mlp(), options={"freeze": True})
    with pytest.raises(UsageError, match="Dynamo has no config"):
        fullgraph.compile(Mlp(), preset=Preset.of("typo", dynamo={"recompile_limt": 2}))
    for kwargs, message in [
        (dict(preset="nope"), "choose one of dev, perception"),
        (dict(preset="auto"), "preset='auto' needs a measured choice.*dev, perception"),
        (dict(on_error="ignore"), "'raise', 'eager'"),
        (dict(dtype=torch.int8), "floating torch dtype"),
        (dict(recompile_limit=0), "positive int"),
        (dict(choice="eager fp32"), "goes with preset='auto'"),
        (dict(plan={"fc3": "dev"}), r"'fc3'.*did you mean.*top-level: fc1, fc2"),
        (dict(dynamic={"x": {0: (8, 1)}}), "min"),
    ]:
        with pytest.raises(UsageError, match=message):
            fullgraph.compile(Mlp(), **kwargs)
    assert counters["frames"]["ok"] == before


class Probe(CustomGraphPass):
    """An Inductor pass that records the config Inductor and Dynamo run under while compiling (uuid None: the FX
    graph cache is bypassed, so the pass runs on every compile)."""

    def __init__(self):
        self.seen = []

    def __call__(self, graph):
        self.seen.append((torch._inductor.config.epilogue_fusion, torch._dynamo.config.recompile_limit))

    def uuid(self):
        return None


def test_a_presets_config_reaches_its_model_only():
    fusion, limit = torch._inductor.config.epilogue_fusion, torch._dynamo.config.recompile_limit
    probe = Probe()
    preset = Preset.of("probe", options={"epilogue_fusion": not fusion, "post_grad_custom_post_pass": probe},
                       dynamo={"recompile_limit": limit + 3})  # fmt: skip
    a = fullgraph.compile(Mlp(), preset=preset)
    seen_by_b = []

    def counting(gm, example_inputs):
        seen_by_b.append((torch._inductor.config.epilogue_fusion, torch._dynamo.config.recompile_limit))
        return gm.forward

    model_b = Other()
    b = torch.compile(model_b, backend=counting)
    x = torch.randn(3, 8)
    torch.testing.assert_close(a(x), a.original_module(x))
    assert probe.seen == [(not fusion, limit + 3)]  # A compiled under its own config
    assert (torch._inductor.config.epilogue_fusion, torch._dynamo.config.recompile_limit) == (fusion, limit)
    assert torch._inductor.config.post_grad_custom_post_pass is None
    with torch.no_grad():
        torch.testing.assert_close(b(x), model_b(x))
    assert seen_by_b == [(fusion, limit)]  # B, compiled after A's calls, sees the defaults
    assert a.stats.frames_compiled == 1 and a.stats.compile_seconds > 0


def test_a_compile_failure_falls_back_to_eager_once_with_one_warning():
    model = Broken()
    cm = fullgraph.compile(model, backend="eager", fullgraph=True, on_error="eager")
    x = torch.randn(5, 8)
    with pytest.warns(CompileFallbackWarning, match="Broken.*failed to compile.*eagerly") as caught:
        out = cm(x)
    assert len([w for w in caught if issubclass(w.category, CompileFallbackWarning)]) == 1
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x2 = torch.randn(5, 8)
        with torch.no_grad():
            torch.testing.assert_close(cm(x2), model(x2))
    assert cm.stats.fell_back and "eager after" in repr(cm)
    with pytest.raises(Exception, match=r"(?i)data-dependent|generic_jump|graph break"):
        fullgraph.compile(Broken(), backend="eager", fullgraph=True)(x)


def test_inputs_the_eager_model_rejects_too_raise_its_error_and_keep_compiling():
    cm = fullgraph.compile(Mlp(), backend="eager", on_error="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            cm(torch.randn(2, 5))
    assert cm.stats.fell_back is None
    cm(torch.randn(2, 8))
    assert cm.stats.frames_compiled >= 1


def test_strict_recompiles_raise_on_a_new_shape_after_warm_up():
    cm = fullgraph.compile(Mlp(), backend="eager", dynamic=False, strict_recompiles=True)
    cm.warmup(torch.randn(4, 8)).warmup(torch.randn(6, 8))
    cm(torch.randn(4, 8))
    cm(torch.randn(6, 8))
    with pytest.raises(StrictRecompileError, match="after warm-up"):
        cm(torch.randn(5, 8))
    cm.warmup(torch.randn(5, 8))
    cm(torch.randn(5, 8))


def test_stats_count_each_models_own_compiles():
    one = fullgraph.compile(Mlp(), backend="eager", dynamic=False)
    two = fullgraph.compile(Broken(), backend="eager")
    plain = torch.compile(Other(), backend="eager")
    one(torch.randn(2, 8))
    two(torch.randn(2, 8))
    plain(torch.randn(2, 8))
    one(torch.randn(3, 8))
    plain(torch.randn(4, 8))
    one(torch.randn(3, 8))
    s1, s2 = one.stats, two.stats
    assert (s1.calls, s1.frames_compiled, s1.graph_breaks) == (3, 2, 0)
    assert len(s1.recompiles) == 1 and "size mismatch" in s1.recompiles[0].reason
    assert s1.recompiles[0].function == "forward"
    assert s2.calls == 1 and s2.graph_breaks == 1 and s2.recompiles == () and s2.frames_compiled >= 2
    assert s2.break_reasons


def test_dtype_casts_the_model_and_floating_inputs():
    ref = Mlp()
    model = Mlp()
    model.load_state_dict(ref.state_dict())
    cm = fullgraph.compile(model, backend="eager", dtype=torch.float64)
    x = torch.randn(3, 8)
    out = cm(x)
    assert out.dtype == torch.float64 and model.fc1.weight.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(out, ref.double()(x.double()))


class Mixed(nn.Module):
    def forward(self, x, n, extra, scale=1.0):
        return x * scale + extra[0] + n, extra[1]


def test_dtype_casts_floating_inputs_at_any_depth_and_leaves_the_rest():
    cm = fullgraph.compile(Mixed(), backend="eager", dtype=torch.float64)
    x, y, ids = torch.randn(2, 3), torch.randn(3), torch.arange(3)
    for extra in ([y, ids], {0: y, 1: ids}):  # the pytree path (a container among the arguments)
        out, kept = cm(x, 2, extra)
        assert out.dtype == torch.float64 and kept.dtype == torch.int64
        torch.testing.assert_close(out, x.double() + y.double() + 2)
    plain = fullgraph.compile(nn.Linear(3, 3), backend="eager", dtype=torch.float64)
    for t in (x, x.double(), x.half()):  # the fast path: tensors only; any floating dtype comes in cast
        assert plain(t).dtype == torch.float64


def test_a_changed_input_is_caught_after_calls_that_skipped_the_check():
    cm = fullgraph.compile(Mlp(), backend="eager")
    x = torch.randn(3, 8)
    for _ in range(3):  # the second and third call match the first: the check is skipped
        cm(x)
    with pytest.raises(
        UsageError, match=r"input 'x': the model was compiled for torch.float32 on cpu, got torch.float64"
    ):
        cm(x.double())
    assert cm(x).shape == (3, 8)
    cm.double()  # .to() and friends forget the inputs seen: the next call sets them anew
    assert cm(x.double()).dtype == torch.float64


class Keyed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, extra):
        return self.fc(x) + extra["bias"]


def test_inputs_keep_the_dtype_and_device_they_were_compiled_for():
    cm = fullgraph.compile(Keyed(), backend="eager")
    x, bias = torch.randn(2, 8), torch.randn(8)
    cm(x, {"bias": bias})
    with pytest.raises(UsageError, match=r"input 'x': the model was compiled for torch.float32 on cpu, got "
                                         r"torch.float64 on cpu"):  # fmt: skip
        cm(x.double(), {"bias": bias})
    with pytest.raises(UsageError, match=r"input \"extra\['bias'\]\": .*got torch.float16"):
        cm(x, extra={"bias": bias.half()})
    cm(x, {"bias": bias})  # a container among the positional arguments is checked at every call, never skipped
    with pytest.raises(UsageError, match=r"input \"extra\['bias'\]\": .*got torch.float16"):
        cm(x, {"bias": bias.half()})
    fresh = fullgraph.compile(Keyed(), backend="eager")
    with pytest.raises(UsageError, match="input 'x' is on meta but the model is on cpu"):
        fresh(torch.empty(2, 8, device="meta"), {"bias": bias})
    assert counters["frames"]["ok"] >= 1 and fresh.stats.calls == 0


def test_it_behaves_like_the_model():
    model = Mlp()
    cm = fullgraph.compile(model, preset="perception")
    assert isinstance(cm, nn.Module) and isinstance(cm, CompiledModel)
    assert cm.fc1 is model.fc1 and cm.scale == 0.5
    cm.scale = 2.0
    assert model.scale == 2.0
    assert list(cm.state_dict()) == list(model.state_dict())
    other = Mlp()
    cm.load_state_dict(other.state_dict())
    torch.testing.assert_close(model.fc1.weight, other.fc1.weight)
    assert "preset='perception'" in repr(cm) and "mode='reduce-overhead'" in repr(cm) and "Mlp(" in repr(cm)
    assert not model.training
    with pytest.raises(AttributeError):
        cm.no_such_thing  # noqa: B018


def test_stats_count_each_recompile_once_however_many_cache_entries_it_tried():
    # The k-th recompile of a function makes Dynamo record one guard failure per cache entry, k in all: four sizes
    # are three recompiles (1 + 2 + 3 = 6 failures), each with the newest entry's reason.
    cm = fullgraph.compile(Mlp(), backend="eager", dynamic=False, recompile_limit=16)
    sizes = (3, 5, 7, 9)
    for n in sizes:
        cm(torch.randn(n, 8))
    st = cm.stats
    assert st.frames_compiled == len(sizes) and len(st.recompiles) == len(sizes) - 1
    for previous, rec in zip(sizes[:-1], st.recompiles, strict=True):
        assert f"expected {previous}," in rec.reason, rec.reason
    cm(torch.randn(5, 8))  # a cache hit: no recompile
    assert len(cm.stats.recompiles) == len(sizes) - 1


def test_a_code_object_another_model_compiled_first_is_not_this_models_recompile():
    from fullgraph.compile.stats import last_record, recompiles_since

    a = fullgraph.compile(WrappedA(), backend="eager", dynamic=False)
    b = fullgraph.compile(WrappedB(), backend="eager", dynamic=False)
    x = torch.randn(4, 8)
    a(x)
    before = last_record()
    out = b(x)
    # Dynamo files b's first compile of `wrapper` as a recompile (a's cache entry failed its guards) ...
    assert [m.co_name for m in recompiles_since(before)] == ["wrapper"]
    # ... which is not one for b: it compiled once
    assert b.stats.frames_compiled == 1 and b.stats.recompiles == ()
    torch.testing.assert_close(out, torch.relu(b.fc(x)) * 2)
    b(torch.randn(5, 8))  # a new size: b's own entry fails, a real recompile, named with b's guard
    assert len(b.stats.recompiles) == 1 and "expected 4" in b.stats.recompiles[0].reason
    assert a.stats.recompiles == ()


def test_to_recompiles_on_the_next_call():
    model = Mlp()
    cm = fullgraph.compile(model, backend="eager", strict_recompiles=True)
    x = torch.randn(2, 8)
    cm(x)
    cm.to(torch.float64)
    out = cm(x.double())  # a new dtype: the checks start over, and the recompile is not an error
    with torch.no_grad():
        torch.testing.assert_close(out, model(x.double()))
    assert cm.stats.frames_compiled == 2


def test_auto_takes_the_doctors_choice():
    report = SimpleNamespace(recommendation=SimpleNamespace(config="eager fp32"))
    cm = fullgraph.compile(Mlp(), preset="auto", choice=report)
    x = torch.randn(2, 8)
    cm(x)
    assert cm.stats.frames_compiled == 0 and "auto: eager fp32" in repr(cm)
    cm = fullgraph.compile(Mlp(), preset="auto", choice=SimpleNamespace(config="compile reduce-overhead fp32"))
    assert cm.resolved.mode == "reduce-overhead" and cm.resolved.options.get("triton.cudagraphs") is True
    with pytest.raises(UsageError, match=r"dtype=torch\.float64 contradicts"):
        fullgraph.compile(Mlp(), preset="auto", choice="compile default fp32", dtype=torch.float64)
    with pytest.raises(UsageError, match=r"without a recommendation.*dev, perception"):
        fullgraph.compile(Mlp(), preset="auto", choice=SimpleNamespace(recommendation=None))


def test_debug_writes_this_models_trace_only(tmp_path):
    cm = fullgraph.compile(Mlp(), backend="eager", debug=tmp_path / "trace")
    cm(torch.randn(2, 8))
    (log,) = cm.debug_files
    with open(log) as f:
        text = f.read()
    assert '"dynamo_start"' in text and '"str"' in text
    size = len(text)
    torch.compile(Other(), backend="eager")(torch.randn(2, 8))
    with open(log) as f:
        assert len(f.read()) == size


def test_the_top_level_name_is_the_callable_package():
    assert fullgraph.compile.PRESETS is fullgraph.compile.presets.PRESETS
    assert isinstance(fullgraph.compile(Mlp(), backend="eager"), CompiledModel)
    code = (
        "import sys, fullgraph; assert 'torch' not in sys.modules; import torch; "
        "cm = fullgraph.compile(torch.nn.Linear(2, 2), backend='eager'); cm(torch.randn(1, 2)); "
        "import fullgraph.compile.presets; assert fullgraph.compile(torch.nn.Linear(2, 2)).stats.calls == 0"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_declared_dynamic_dims_compile_one_graph_for_the_range():
    model = Mlp()
    cm = fullgraph.compile(model, backend="eager", dynamic={"x": {0: (2, 16)}}, strict_recompiles=True)
    cm.warmup(torch.randn(3, 8))
    for n in (5, 16, 2):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(cm(x), model(x))
    assert cm.stats.frames_compiled == 1 and cm.stats.recompiles == ()
    with pytest.raises(UsageError, match="outside its declared range"):
        cm(torch.randn(17, 8))


def test_a_fullgraph_compile_counts_its_frame():
    # torch 2.13 does not count a fullgraph=True frame under frames["ok"]; the stats must still see it.
    torch._dynamo.reset()
    cm = fullgraph.compile(torch.nn.Linear(4, 4), backend="eager", fullgraph=True)
    x = torch.randn(3, 4)
    torch.testing.assert_close(cm(x), cm.original_module(x))
    assert cm.stats.frames_compiled == 1
    cm(x)
    assert cm.stats.frames_compiled == 1 and cm.stats.calls == 2


def test_stats_still_count_after_dynamos_counters_are_cleared():
    # the tracker looks Dynamo's tables up once per process; torch's test harness and tools clear them in place
    cm = fullgraph.compile(Mlp(), backend="eager", dynamic=False)
    cm(torch.randn(2, 8))
    torch._dynamo.utils.counters.clear()
    cm(torch.randn(5, 8))  # a recompile after the clear
    cm(torch.randn(5, 8))
    s = cm.stats
    assert (s.calls, s.frames_compiled) == (3, 2) and len(s.recompiles) == 1


class Decoder(nn.Module):
    """A model with its own decoding loop that calls itself, as transformers' generate does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.steps = 3

    def forward(self, x):
        return torch.tanh(self.lin(x))

    def generate(self, x):
        for _ in range(self.steps):
            x = self(x)
        return x


def test_generate_through_a_compiled_model_says_once_that_it_runs_uncompiled():
    model = Decoder().eval()
    cm = fullgraph.compile(model, "dev")
    x = torch.randn(2, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cm.steps == 3  # other attributes: silent
        with torch.no_grad():
            out = cm.generate(x)
            again = cm.generate(x)
    said = [w for w in caught if issubclass(w.category, fullgraph.compile.UncompiledCallWarning)]
    assert len(said) == 1 and "Decoder.generate through fullgraph.compile" in str(said[0].message)
    assert "whose calls of the model run the uncompiled forward" in str(said[0].message)
    assert said[0].filename == __file__  # pointed at the caller's line
    with torch.no_grad():
        torch.testing.assert_close(out, model.generate(x))
    assert torch.equal(out, again) and cm.stats.graphs == 0  # nothing compiled: the loop ran the module itself
