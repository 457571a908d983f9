"""fullgraph.compile's guard filter (compile/guards.py): Dynamo stops checking the identity of fullgraph's own code on
every call, and keeps every guard on state (op policies, tensors, modules, the user's globals)."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import fullgraph
from fullgraph import ops
from fullgraph.compile import guards
from fullgraph.errors import UsageError
from fullgraph.models.dit import dit

SMALL = {"dim": 64, "heads": 4, "depth": 2, "max_tokens": 16}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def entry(name, guard_type, value=None):
    return SimpleNamespace(name=name, guard_type=guard_type, has_value=value is not None, value=value)


def test_identity_guards_on_our_code_go_and_state_stays():
    ours = "G['__import_fullgraph_dot_ops_dot_direct']"
    dropped = [
        entry(f"{ours}._traced.__code__", "ID_MATCH"),
        entry(f"{ours}._traced", "CLOSURE_MATCH"),
        entry(f"{ours}.torch", "MODULE_MATCH"),
        entry(f"{ours}.Direct", "CLASS_MATCH"),
        entry(f"{ours}.layer_norm_modulate_native.__defaults__[1]", "CONSTANT_MATCH"),
        entry(ours, "DUPLICATE_INPUT"),
        entry("G['direct']", "MODULE_MATCH", value=ops.direct),  # our module under a model's own name for it
        entry("G['helper']", "CLOSURE_MATCH", value=ops.direct.usable),
    ]
    kept = [
        entry("G['__import_fullgraph_dot_ops_dot_policies']._version[0]", "EQUALS_MATCH"),  # a policy change
        entry("G['__import_fullgraph_dot_ops_dot_policies']", "MODULE_MATCH"),
        entry("G['__import_fullgraph_dot_ops_dot_policies']._local", "HASATTR"),
        entry(f"{ours}.FORMS", "DICT_KEYS_MATCH"),  # a value, not an identity
        entry(f"{ours}.torch.cat", "BUILTIN_MATCH"),  # torch's function: a user may patch it
        entry("G['my_helper']", "CLOSURE_MATCH", value=test_identity_guards_on_our_code_go_and_state_stays),
        entry("L['self']._modules['fc']._parameters['weight']", "TENSOR_MATCH"),
        entry("G['scale']", "CONSTANT_MATCH", value=2),
        entry("L['self'].act", "ID_MATCH", value=ops.direct.usable),  # an attribute holding ours: a model may swap it
    ]
    assert guards.trusted_code(dropped) == [False] * len(dropped)
    assert guards.trusted_code(kept) == [True] * len(kept)


def _compile_recording(model, **kwargs):
    """fullgraph.compile(model) with a filter of the user's own that keeps everything and records what it saw."""
    seen = []

    def record(entries):
        seen.extend(entries)
        return [True] * len(entries)

    return fullgraph.compile(model, "dev", options={"guard_filter_fn": record}, **kwargs), seen


def test_a_compiled_dit_drops_our_identity_guards_and_still_recompiles_on_a_policy_change():
    torch.manual_seed(0)
    model = dit("dit_s", **SMALL).eval()
    x, c = torch.randn(2, 8, 64), torch.randn(2, 64)
    compiled, seen = _compile_recording(model)
    with torch.no_grad():
        expected = model(x, c)
        got = compiled(x, c)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    ours = [e for e in seen if "__import_fullgraph_dot_" in e.name]
    dropped = [e for e in ours if not guards.keeps(e)]
    kept = [e for e in ours if guards.keeps(e)]
    # the DiT's trace reads our dispatch: dozens of identity guards that the filter drops, the policy state kept
    assert len(dropped) >= 30, [e.name for e in ours]
    assert any("policies" in e.name for e in kept)
    assert not any(e.guard_type in guards.IDENTITY and "policies" not in e.name for e in kept)
    # a policy change must still recompile: the guards on the policy state are kept
    counters.clear()
    with torch.no_grad(), ops.policy(all="native"):
        torch.testing.assert_close(compiled(x, c), expected, rtol=1e-4, atol=1e-4)
    assert counters["stats"]["unique_graphs"] >= 1


def test_fullgraph_compile_applies_it():
    """A replaced function of our dispatch (same behaviour, another code object) recompiles under plain
    torch.compile, and not under fullgraph.compile, which no longer checks our code's identity."""
    assert guards.supported()
    torch.manual_seed(0)
    model = dit("dit_s", **SMALL).eval()
    x, c = torch.randn(2, 8, 64), torch.randn(2, 64)
    original = ops.direct.version

    def version():
        return original()

    graphs = {}
    for name, compiled in (("plain", torch.compile(model)), ("fullgraph", fullgraph.compile(model, "dev"))):
        torch._dynamo.reset()
        with torch.no_grad():
            compiled(x, c)
            counters.clear()
            ops.direct.version = version
            try:
                compiled(x, c)
            finally:
                ops.direct.version = original
        graphs[name] = counters["stats"]["unique_graphs"]
    assert graphs == {"plain": 1, "fullgraph": 0}


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = 0.5

    def forward(self, x):
        return self.fc(x) * self.scale


@pytest.mark.parametrize("users_filter", [False, True])
def test_the_users_own_filter_is_applied_with_ours(users_filter):
    """Ours alone keeps the guard on a module attribute (a change recompiles); with the user's filter that drops
    every guard, the compiled code keeps the old value: the user's filter took effect beside ours."""

    def drop_all(entries):
        return [False] * len(entries)

    model = Scaled()
    options = {"guard_filter_fn": drop_all} if users_filter else {}
    compiled = fullgraph.compile(model, "dev", options=options)
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        model.scale = 2.0
        got = compiled(x)
        fresh = model(x)
    stale = fresh / 4
    torch.testing.assert_close(got, stale if users_filter else fresh)


def test_a_guard_filter_that_is_not_a_function_is_a_usage_error():
    with pytest.raises(UsageError, match="guard_filter_fn must be a function"):
        fullgraph.compile(nn.Linear(4, 4), "dev", options={"guard_filter_fn": "all"})


def test_trusted_guards_is_there_without_importing_torch():
    code = "import sys, fullgraph; assert callable(fullgraph.trusted_guards); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
