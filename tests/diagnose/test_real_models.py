"""The doctor on real-world model shapes (tests/diagnose/real_models.py): a transformers encoder with keyword inputs,
a greedy decoding loop, a detection model on a list of images, the chapter's exercise 2.5, a model that prints.

Each is checked against `torch._dynamo.explain` on the same weights and inputs: the same break count, every break
explain locates located by the doctor too, in a real file with a fix.
"""

import contextlib
import io
import os

import pytest
import torch

import fullgraph
from tests.diagnose import real_models
from tests.diagnose.real_models import fresh_dynamo, line_of  # noqa: F401 (a fixture)
from tests.diagnose.targets import exercise_2_5

# name -> doctor modes. The compile mode is the point only where a decorated function or printed output meets it.
MODES = {
    "bert": ("eager",),
    "gpt2_greedy": ("eager",),
    "detector": ("eager",),
    "exercise_2_5": ("eager", "default"),
    "chatty": ("eager",),
}
# Breaks each model has by construction: explain counts at least these on any weights (checked with torch 2.13).
AT_LEAST = {"bert": 0, "gpt2_greedy": 1, "detector": 1, "exercise_2_5": 1, "chatty": 2}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def explain(fn, args, kwargs):
    """explain's count and the (file, line) of each break it locates. explain resets Dynamo before and after; what
    the model prints meanwhile is dropped, so a test reading the terminal sees only what the doctor let through."""
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        out = torch._dynamo.explain(fn)(*args, **kwargs)
    where = {(r.user_stack[-1].filename, r.user_stack[-1].lineno) for r in out.break_reasons if r.user_stack}
    return out.graph_break_count, where


def examine(name: str, **options):
    fn, args, kwargs = real_models.MODELS[name]()
    count, where = explain(fn, args, kwargs)
    torch._dynamo.reset()
    options = {"modes": MODES[name], "reps": 3, "profile": False, **options}
    report = fullgraph.doctor(fn, args, kwargs=kwargs, target=name, **options)
    return report, count, where


@pytest.fixture(scope="module")
def examined():
    """`examine(name)` with the default options, run once per model for all the tests that read its report."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = examine(name)
        return cache[name]

    return get


def assert_located(report):
    for b in report.graph_breaks:
        assert os.path.isfile(b.file), f"break at {b.file!r} (not a file): {b.reason}"
        assert b.line > 0 and b.fix.strip(), b


@pytest.mark.parametrize(
    "name",
    [
        "bert",
        pytest.param("gpt2_greedy", marks=pytest.mark.slow),
        "detector",
        "exercise_2_5",
        "chatty",
    ],
)
def test_break_count_and_locations_match_explain(name, examined):
    report, count, where = examined(name)
    assert count >= AT_LEAST[name], f"explain found {count} breaks in {name}; the model is meant to have more"
    assert report.graph_break_count == count, f"{name}: doctor {report.graph_break_count}, explain {count}"
    assert where <= {(b.file, b.line) for b in report.graph_breaks}, f"{name}: explain locates breaks the doctor lacks"
    assert_located(report)
    eager = next(c for c in report.configs if c.mode == "eager")
    assert eager.error is None and eager.median_ms > 0, eager


def test_keyword_inputs_are_described_by_name(examined):
    report, _, _ = examined("bert")
    assert report.inputs == ["input_ids=2x16:int64", "attention_mask=2x16:int64"]


def test_exercise_2_5_breaks_on_the_value_branch_and_every_mode_runs(examined):
    """The decorated function with a Python float: one break, at the value branch (the shape branch is guarded,
    erratum 2), and the compile mode runs the function as well as eager does."""
    report, _, _ = examined("exercise_2_5")
    path = exercise_2_5.__file__
    assert [(b.file, b.line) for b in report.graph_breaks] == [(path, line_of(path, "if scores.max() > threshold:"))]
    assert report.inputs[0] == "48x16:float32" and len(report.inputs) == 2
    assert [c.name for c in report.configs] == ["eager fp32", "compile default fp32"]
    assert all(c.ok for c in report.configs), report.configs
    assert report.recommendation is not None


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("detector", "boxes, scores = boxes[keep], scores[keep]"),
        pytest.param("gpt2_greedy", "if finished.all():", marks=pytest.mark.slow),
    ],
)
def test_a_frame_dynamo_skips_is_reported_where_it_breaks(name, text, examined):
    """A break inside a loop makes Dynamo skip the whole frame (it runs eagerly): the detection model's per-image
    loop at its score filter, the decoding loop at its stop test. explain lists no reason for such a frame; the
    doctor must still say where it happened, since this is the break that costs the most."""
    report, _, _ = examined(name)
    path = real_models.__file__
    line = line_of(path, text)
    assert (path, line) in {(b.file, b.line) for b in report.graph_breaks}, [
        (os.path.basename(b.file), b.line, b.reason) for b in report.graph_breaks
    ]
    assert_located(report)


@pytest.mark.slow
def test_the_decoding_loop_recompiles_as_the_cache_grows(examined):
    """The language model is compiled once for the prompt and again for each new cache length (until Dynamo marks
    it dynamic): explain counts those graphs as breaks, so the report must show them as recompiles."""
    report, count, _ = examined("gpt2_greedy")
    assert count >= 2
    assert report.recompiles, "explain counts recompiled graphs; the report names none"
    assert all(r.guard_failure and r.fix for r in report.recompiles)


def test_print_in_forward_is_summarized_not_flooded(capsys):
    """Chatty prints twice per call and the doctor calls it dozens of times: the report keeps a line per kind of
    output (stdout, stderr), quoting it, and the terminal sees (almost) none of it."""
    report, _, _ = examine("chatty", modes=("eager", "default"), reps=10)
    captured = capsys.readouterr()
    printed = (captured.out + captured.err).count("chatty:")
    assert printed <= 2, f"the model's prints reached the terminal {printed} times"
    assert any("chatty: after" in line for line in report.output), report.output
    assert len(report.output) <= 4, report.output  # one line per kind of output (stdout, stderr, ...)
    assert all(c.error is None for c in report.configs), report.configs
    print("after the doctor")  # the doctor handed stdout back
    assert capsys.readouterr().out == "after the doctor\n"
