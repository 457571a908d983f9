import inspect
import os

import pytest
import torch

from fullgraph.compile.options import dynamo_config_name
from fullgraph.diagnose import dynamo
from fullgraph.diagnose.inputs import Example
from tests.diagnose import models
from tests.shared_wrapper import WrappedA, WrappedB
from tests.skips import requires_cuda

MODELS_FILE = os.path.abspath(models.__file__)


def break_lines(cls) -> set[int]:
    """Lines of cls.forward marked `# break` in models.py."""
    src, start = inspect.getsourcelines(cls.forward)
    return {start + i for i, line in enumerate(src) if "# break" in line}


@pytest.mark.parametrize("cls", [*models.BROKEN, models.Clean], ids=lambda c: c.__name__)
def test_break_count_matches_explain_and_names_user_lines(cls):
    model = cls()
    x = torch.randn(4, 16).abs() + 0.1  # positive: the value branches take the same path in both runs
    rec, _ = dynamo.capture_breaks(model, Example.of((x,)))
    expected = torch._dynamo.explain(model)(x).graph_break_count
    assert rec.graph_break_count == expected
    if cls is models.Clean:
        assert rec.breaks == []
    # explain counts graphs - 1; a break inside a called module splits the callee too, so that count can exceed the
    # places that broke. Each place is listed once, with its line.
    marked = break_lines(cls) | (break_lines(models.ItemCall) if cls is models.Several else set())
    assert {b.line for b in rec.breaks} == marked and len(rec.breaks) == len(marked) <= expected
    for b in rec.breaks:
        assert os.path.abspath(b.file) == MODELS_FILE and b.line > 0
        assert b.reason and b.fix


def test_break_details_from_torch_registry():
    rec, _ = dynamo.capture_breaks(models.ItemCall(), Example.of(torch.randn(3, 16)))
    (b,) = rec.breaks
    assert "item()" in b.source and b.function == "forward"
    if dynamo._registry():  # torch >= 2.7 ships its graph-break registry
        assert b.gb_id.startswith("GB") and b.gb_type and b.hint


def test_other_compiled_models_keep_their_code():
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    other = torch.compile(lambda t: t * 2 + 1, backend=counting)
    x = torch.randn(8)
    other(x)
    assert len(compiles) == 1
    dynamo.capture_breaks(models.Several(), Example.of(torch.randn(4, 16)))
    other(x)
    assert len(compiles) == 1  # the doctor's run did not discard `other`'s compiled code
    torch._dynamo.explain(models.ItemCall())(torch.randn(4, 16))
    other(x)
    assert len(compiles) == 2  # explain does (it resets Dynamo): the reason the doctor does not use it


def test_recompiles_found_with_guard_and_fix():
    rec, compiled = dynamo.capture_breaks(models.Clean(), Example.of(torch.randn(4, 16)))
    variants = [("inputs", Example.of(torch.randn(4, 16))), ("batch", Example.of(torch.randn(9, 16)))]
    found = dynamo.capture_recompiles(compiled, variants)
    assert [r.trigger for r in found] == ["batch"]
    (r,) = found
    assert "size mismatch at index 0" in r.guard_failure and "mark_dynamic(input, 0" in r.fix
    assert os.path.abspath(r.file) == MODELS_FILE and r.function == "forward"
    assert rec.graph_break_count == 0  # the recompile is not counted as a new graph


def test_one_batch_change_is_one_cause_named_after_the_users_function():
    # A broken forward is three fragments; a new batch size fails the guards of each: one cause, counted three times.
    rec, compiled = dynamo.capture_breaks(models.ValueBranch(), Example.of(torch.randn(4, 16).abs()))
    found = dynamo.capture_recompiles(compiled, [("batch", Example.of(torch.randn(9, 16).abs()))])
    assert rec.graph_break_count == 1
    (r,) = found
    assert r.count >= 2 and r.function == "forward" and "torch_dynamo_resume" not in r.function
    assert "mark_dynamic(input, 0" in r.fix


def test_resume_function_names_read_as_the_users():
    assert dynamo.user_function_name("torch_dynamo_resume_in_forward_at_32") == "forward (after the break at line 32)"
    assert dynamo.user_function_name("forward") == "forward"


class PerItem(torch.nn.Module):
    """A per-image loop, as detection models have: each new image size recompiles `one`, breaking again."""

    def forward(self, xs):
        return [self.one(x) for x in xs]

    def one(self, x):
        y = x * 2
        return y * y.max().item()  # the same line breaks once per image size


def test_breaks_in_a_loop_are_one_place_with_a_count():
    xs = [torch.randn(n) for n in (5, 6, 7, 8)]
    torch._dynamo.reset()
    rec, _ = dynamo.capture_breaks(PerItem(), Example.of((xs,)))
    grouped = dynamo.group_breaks(rec.breaks)
    assert len(grouped) == 1 and grouped[0].count == len(rec.breaks) >= 2
    assert rec.graph_break_count == torch._dynamo.explain(PerItem())(xs).graph_break_count


def test_registry_types_for_reasons_without_a_link_and_whole_hints():
    if not dynamo._registry():
        pytest.skip("this torch ships no graph-break registry")
    gb_id, gb_type, _ = dynamo._registry_entry("generic_jump TensorVariable()")
    assert gb_id == "GB0170" and gb_type == "Data-dependent branching"
    gb_id, gb_type, hint = dynamo._registry_entry("Dynamic shape operator\n  Explanation: x")
    assert gb_id == "GB0036" and "capture_dynamic_output_shape_ops = True" in hint  # split over two items
    assert dynamo._registry_entry("step_unsupported")[1].startswith("Unsupported bytecode")


@pytest.mark.parametrize(
    ("failure", "expect"),
    [
        ("___check_obj_id(func.__code__, 1403)", "create it once"),
        ("tensor 'x' size mismatch at index 1. expected 8, actual 17", "dim 1 dynamic"),
        ("L['n'] == 3", "pass it as a tensor"),
        ("4/0: size[0] == 800  # boxes_y = boxes_y.clamp(min=0, max=height)", "size as a fixed number"),
        ("4/1: tensor 'boxes' rank mismatch. expected 2, actual 3", "number of dims changed"),
        ("34/1: ___check_type_id(___stack0, 10731296), type=<class 'int'>", "changed type"),
    ],
)
def test_recompile_fix_table(failure, expect):
    assert expect in dynamo._first_match(dynamo.RECOMPILE_FIXES, failure)


class LazyScale(torch.nn.Module):
    """Set-once state, as torchvision's poolers set their scales on the first call: that first call breaks where
    later ones do not, so a model already called once counts fewer graphs than a fresh copy."""

    def __init__(self):
        super().__init__()
        self.scale = None

    def forward(self, x):
        if self.scale is None:
            self.scale = float(x.abs().max())  # break: a host sync, on the first call only
        return x * self.scale


def test_counts_match_explain_on_a_fresh_copy_not_on_a_model_already_called():
    import copy

    x = torch.randn(4, 8)
    model = LazyScale()
    fresh = copy.deepcopy(model)
    rec, _ = dynamo.capture_breaks(model, Example.of(x))  # the first call ever: breaks at the setup
    assert rec.graph_break_count == torch._dynamo.explain(fresh)(x).graph_break_count == 1
    warmed = torch._dynamo.explain(model)(x).graph_break_count  # the same instance, set up by now
    assert warmed == 0  # why a comparison must start both from fresh copies


def test_room_for_recompiles_is_scoped():
    cfg = torch._dynamo.config
    name = dynamo_config_name("recompile_limit")
    before = getattr(cfg, name)
    with dynamo.room_for_recompiles():
        assert getattr(cfg, name) >= 64
    assert getattr(cfg, name) == before


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("generic_jump TensorVariable()", "torch.where"),
        ("Unsupported Tensor.item() call", "0-d tensor"),
        ("Failed to trace builtin operator\n  Explanation: ... `print` ...", "print"),
        ("something new", "torch's hint"),
    ],
)
def test_fix_table(text, expect):
    assert expect in dynamo._first_match(dynamo.BREAK_FIXES, text)


class MutatesInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)  # an input mutated in place: CUDA graphs cannot replay this safely
        return x * 2


@requires_cuda
def test_cudagraph_skip_is_captured_with_its_reason():
    compiled = torch.compile(MutatesInput(), mode="reduce-overhead")
    x = torch.randn(64, device="cuda")
    with torch.no_grad(), dynamo.cudagraph_skips() as skips:
        for _ in range(3):
            compiled(x)
    assert skips and any("mutat" in s for s in skips), skips


def test_each_recompile_counts_once_however_many_cache_entries_it_tried():
    # Dynamo records one guard failure per cache entry it tried: the k-th recompile of a function adds k. Three
    # sizes after the first are three recompiles of one cause, not 1 + 2 + 3 = 6.
    torch._dynamo.reset()
    compiled = torch.compile(models.Clean(), backend="eager", dynamic=False)
    with torch.no_grad():  # as capture_recompiles calls it: grad mode is guarded too
        compiled(torch.randn(2, 16))
    variants = [("batch", Example.of(torch.randn(n, 16))) for n in (3, 5, 7)]
    found = dynamo.capture_recompiles(compiled, variants)
    assert len(found) == 1 and found[0].count == 3, found


def _shared(t):
    torch._dynamo.graph_break()  # compiled as its own frame, once per kind of argument
    return t * 2 + 1


class SharedHelper(torch.nn.Module):
    """One forward calls a helper twice with arguments of two ranks, as a decorator's wrapper shared by several
    modules is called (transformers' SegFormer): a recompile inside the first call, with no input changed."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return _shared(self.fc(x)).sum() + _shared(x[None]).sum()


def test_a_recompile_inside_the_first_call_is_not_blamed_on_the_inputs():
    rec, _ = dynamo.capture_breaks(SharedHelper(), Example.of(torch.randn(2, 8)))
    [r] = dynamo.first_call_recompiles(rec)
    assert r.trigger == "first call" and "rank mismatch" in r.guard_failure
    assert r.fix.startswith("not your inputs: one call runs this function again with other arguments")
    assert "recompile limit (" in r.fix and r.fix.endswith("give it one rank on every call (reshape or unsqueeze the "
                                                           "same way each time)")  # fmt: skip


def test_a_function_another_model_compiled_first_is_no_recompile_of_this_one():
    # Whisper then T5 doctored in one process read "recompiles: 1, first call" for T5: the failed cache entry of
    # transformers' shared `wrapper` was Whisper's. Only this model's own entries count.
    torch.compile(WrappedA(), backend="eager")(torch.randn(2, 8))
    rec, compiled = dynamo.capture_breaks(WrappedB(), Example.of(torch.randn(2, 8)))
    assert dynamo.first_call_recompiles(rec) == [] and rec.graph_break_count == 0
    found = dynamo.capture_recompiles(compiled, [("batch", Example.of(torch.randn(5, 8)))], rec.own)
    assert [r.trigger for r in found] == ["batch"] and "expected 2" in found[0].guard_failure
