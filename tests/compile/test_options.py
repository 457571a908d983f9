import pytest
import torch

from fullgraph.compile.guards import trusted_code
from fullgraph.compile.options import NOT_REGISTERED, mode_options, resolve
from fullgraph.compile.presets import Preset
from fullgraph.errors import UsageError


def test_edge_combines_the_mode_its_options_and_the_users():
    r = resolve("edge", options={"epilogue_fusion": False})
    assert r.mode == "max-autotune-no-cudagraphs"
    assert r.options["max_autotune"] is True and r.options["coordinate_descent_tuning"] is True  # the mode's
    assert r.options["freezing"] is True and r.options["cpp_wrapper"] is True  # the preset's
    assert r.options["epilogue_fusion"] is False  # the user's
    kwargs = r.compile_kwargs()
    assert "mode" not in kwargs and kwargs["backend"] == "inductor"
    # torch.compile's guard filter travels in the same options (compile/guards.py)
    assert kwargs["options"] == {**r.options, "guard_filter_fn": trusted_code}


def test_a_user_option_overrides_the_presets():
    assert resolve("edge", options={"freezing": False}).options["freezing"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(options={"freeze": True}), "no option 'freeze'; did you mean 'freezing'"),
        (dict(options={"joint_graph": True}), "Inductor has no option 'joint_graph'"),
        (dict(mode="reduce-overhead", options={"triton.cudagraphs": False}), "contradicts mode='reduce-overhead'"),
        (dict(mode="max-autotun"), "did you mean 'max-autotune'"),
        (dict(backend="inductr"), "did you mean 'inductor'"),
        (dict(backend="eager", options={"freezing": True}), "would ignore"),
        (dict(backend="eager", mode="max-autotune"), "applies to the inductor backend only"),
        (dict(dynamo={"recompile_limt": 4}), "Dynamo has no config 'recompile_limt'"),
    ],
)
def test_bad_settings_fail_before_compiling_with_a_fix(kwargs, message):
    with pytest.raises(UsageError, match=message):
        resolve("dev", **kwargs)


@pytest.mark.parametrize("backend", ["onnxrt", "tensorrt", "ipex"])
def test_backends_that_are_not_registered_say_what_brings_them(backend):
    if backend in torch._dynamo.list_backends(exclude_tags=()):
        pytest.skip(f"{backend} is registered in this environment")
    with pytest.raises(UsageError, match="cannot run here") as e:
        resolve("dev", backend=backend)
    assert NOT_REGISTERED[backend].split(":")[0] in str(e.value)


def test_dynamic_and_fullgraph_follow_the_preset_unless_given():
    assert resolve("perception").dynamic is False and resolve("perception").fullgraph is True
    assert resolve("perception", dynamic=None).dynamic is None
    assert resolve("perception", fullgraph=False).fullgraph is False
    assert resolve(Preset("mine", mode="reduce-overhead")).options == mode_options("reduce-overhead")


def test_recompile_limit_is_named_for_this_torch():
    r = resolve("perception")
    (name,) = r.dynamo
    assert name in ("recompile_limit", "cache_size_limit") and r.dynamo[name] == 8
    assert hasattr(torch._dynamo.config, name)


def test_resolved_options_compile_for_real():
    r = resolve("dev", options={"epilogue_fusion": True})
    model = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    compiled = torch.compile(model, **r.compile_kwargs())
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize(
    "kwargs, graphs_after",
    [
        ({"mode": "reduce-overhead"}, ("inductor", False)),
        ({"options": {"triton.cudagraphs": True}}, ("inductor", False)),
        ({"backend": "cudagraphs"}, ("eager", None)),
        ({"mode": "max-autotune-no-cudagraphs"}, None),  # nothing to take out: the same Resolved comes back
    ],
)
def test_without_cuda_graphs_keeps_the_compile_and_drops_only_the_replay(kwargs, graphs_after):
    resolved = resolve("dev", **kwargs)
    plain = resolved.without_cuda_graphs()
    assert not plain.replays_cuda_graphs
    if graphs_after is None:
        assert not resolved.replays_cuda_graphs and plain is resolved
        return
    assert resolved.replays_cuda_graphs
    backend, option = graphs_after
    assert plain.backend == backend and plain.options.get("triton.cudagraphs") is option
    # everything else the user asked for stays (mode-expanded options other than the graphs, dynamic, fullgraph)
    assert {k: v for k, v in plain.options.items() if k != "triton.cudagraphs"} == {
        k: v for k, v in resolved.options.items() if k != "triton.cudagraphs"
    }
    assert (plain.dynamic, plain.fullgraph, plain.mode) == (resolved.dynamic, resolved.fullgraph, resolved.mode)


def test_the_per_call_dynamo_config_scope_sets_and_puts_back():
    from fullgraph.compile.options import DynamoConfig

    cfg = torch._dynamo.config
    before = (cfg.recompile_limit, cfg.suppress_errors)
    scope = DynamoConfig({"recompile_limit": before[0] + 5, "suppress_errors": before[1]})
    with pytest.raises(RuntimeError), scope:
        assert cfg.recompile_limit == before[0] + 5 and cfg.suppress_errors == before[1]
        assert [name for name, _ in scope.saved] == ["recompile_limit"]  # a value already in place is left alone
        raise RuntimeError("inside")
    assert (cfg.recompile_limit, cfg.suppress_errors) == before
    with DynamoConfig({"recompile_limit": before[0] + 1}), DynamoConfig({"recompile_limit": before[0] + 2}):
        assert cfg.recompile_limit == before[0] + 2  # nested scopes unwind in order
    assert cfg.recompile_limit == before[0]
