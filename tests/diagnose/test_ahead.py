"""Background compiles of a search's slow rows (`fullgraph.diagnose.ahead`), on the CPU: the edge preset (freezing,
C++ wrapper, max-autotune) is one of them there too."""

import time

import pytest
import torch
from torch import nn

from fullgraph.diagnose import ahead, tune
from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose.inputs import Example
from tests.deploy._models import Linears


class Chatty(nn.Module):
    """Prints 200 KB per call: more than a pipe holds, had the child's stdout been one."""

    def forward(self, x):
        print("x" * 200_000)
        return x * 2


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty Inductor cache folder, the children's too (they inherit the environment)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def test_the_autotuning_rows_are_the_slow_ones():
    found = {m: ahead.slow(cfg.Candidate(m, torch.float32)) for m in ("edge", "max-autotune", "perception", "dev")}
    assert found == {"edge": True, "max-autotune": True, "perception": False, "dev": False}
    assert not ahead.slow(cfg.Candidate("eager", torch.float32))


@pytest.mark.slow
def test_a_row_compiled_ahead_is_built_here_from_the_warm_caches(own_cache):
    torch.manual_seed(0)
    model, x = Linears().eval(), torch.randn(16, 8)
    result = tune.tune(model, (x,), presets=["dev", "edge"], budget=300, ahead=True)
    rows = {r["name"]: r for r in result.table}
    assert rows["compile edge fp32"]["ok"] and rows["compile edge fp32"]["rel_err"] < 1e-5
    (note,) = [n for n in result.notes if n.startswith("compiled ahead")]
    here = float(note.split("compile edge fp32 ")[1].split(" s")[0])
    # the child's compile is shown; this process's build from the caches took a fraction of it
    assert here < 0.5 * rows["compile edge fp32"]["compile_s"], (here, rows["compile edge fp32"]["compile_s"])


def test_a_model_that_cannot_be_pickled_is_compiled_here_with_a_note(own_cache):
    class Local(nn.Module):  # defined in a function: pickle cannot name it
        def forward(self, x):
            return x * 2

    with ahead.Ahead(Local(), Example.of((torch.ones(2),)), [cfg.Candidate("edge", torch.float32)]) as bg:
        assert bg.children == {} and "could not be pickled" in bg.why_not


@pytest.mark.slow
def test_a_child_past_the_deadline_is_killed_and_its_row_reported_late(own_cache):
    c = cfg.Candidate("edge", torch.float32)
    with ahead.Ahead(Linears().eval(), Example.of((torch.randn(4, 8),)), [c]) as bg:
        start = time.monotonic()
        report = bg.wait(c, start + 0.5)
        assert report == {"ok": False, "late": True} and time.monotonic() - start < 10
        assert bg.children[c.name].proc.poll() is not None  # killed, not left running


@pytest.mark.slow
def test_a_child_that_fails_reports_the_error_by_its_first_line(own_cache):
    c = cfg.Candidate("no-such-preset", torch.float32)
    with ahead.Ahead(Linears().eval(), Example.of((torch.randn(4, 8),)), [c]) as bg:
        report = bg.wait(c, time.monotonic() + 120)
    assert report["ok"] is False and "no-such-preset" in report["error"]


def test_with_inductors_caches_off_nothing_runs_ahead_and_the_note_says_why(own_cache):
    row = cfg.Candidate("edge", torch.float32)
    with torch._inductor.config.patch(force_disable_caches=True):
        bg = ahead.Ahead(Linears().eval(), Example.of((torch.randn(4, 8),)), [row])
    with bg:
        assert bg.children == {} and "caches are off" in bg.why_not


@pytest.mark.slow
def test_a_child_that_prints_a_lot_still_reports(own_cache):
    c = cfg.Candidate("dev", torch.float32)
    with ahead.Ahead(Chatty(), Example.of((torch.randn(4, 8),)), [c]) as bg:
        report = bg.wait(c, time.monotonic() + 240)
    assert report["ok"] is True and report["compile_s"] > 0
