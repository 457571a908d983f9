"""Our own fixes (issue 34, item 5): torchvision's NMS breaks and its bf16 failure get fullgraph's fix with its code,
and `with_=` / `--with` measure rows with it applied. torchvision's wheels for this torch need CUDA, so the tests run
a stand-in (`fake_torchvision`) and a detector that calls it as torchvision's detection models do."""

from __future__ import annotations

import contextlib
import copy
import sys

import pytest
import torch

from fullgraph.cli.main import main
from fullgraph.diagnose import fixes
from fullgraph.diagnose.doctor import doctor
from fullgraph.diagnose.html import render_html
from fullgraph.diagnose.report import Report
from fullgraph.diagnose.summary import format_summary
from fullgraph.errors import UsageError
from fullgraph.models import replace_torchvision_nms, upcast_torchvision_roi_align
from tests.diagnose import fake_torchvision

RUN = {"modes": ("eager",), "reps": 3, "profile": False}  # rows without Inductor: the captures are the point
BOTH = (torch.float32, torch.bfloat16)
NMS_CODE = "with fullgraph.models.replace_torchvision_nms():\n    y = model(*args, **kwargs)"


@pytest.fixture
def detector(request, tmp_path, monkeypatch):
    """(path of detector.py, model, args), the fake torchvision importable; both forgotten afterwards. The model is
    `build`'s (NMS only) unless the test is parametrized indirectly with another builder (`build_rcnn`)."""
    path = fake_torchvision.write(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch._dynamo.reset()
    import detector as module

    yield path, *getattr(module, getattr(request, "param", "build"))()
    fake_torchvision.forget()
    torch._dynamo.reset()


def explained(model, args, dtype, *contexts) -> int:
    """torch._dynamo.explain's break count for `model` in `dtype`, run inside `contexts` (a reference of its own)."""
    m = copy.deepcopy(model).to(dtype)
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        return torch._dynamo.explain(m)(*(a.to(dtype) for a in args)).graph_break_count


def test_torchvision_nms_break_and_bf16_failure_get_our_fix_with_its_code(detector):
    _, model, args = detector
    r = doctor(model, args, dtypes=BOTH, **RUN)
    (brk,) = r.breaks
    assert brk.file.endswith("torchvision/ops/boxes.py") and brk.function == "nms"
    assert brk.fixes == ["nms", "dynamic_output_shapes"]
    assert "fullgraph's" in brk.fix and "--with nms,dynamic_output_shapes" in brk.fix
    assert "pad to a fixed size" not in brk.fix  # the user cannot pad inside torchvision
    assert brk.code.startswith("with fullgraph.models.replace_torchvision_nms(), torch._dynamo.config.patch(")
    bf16 = next(c for c in r.configs if c.name == "eager bf16")
    assert '"nms_kernel" not implemented for' in bf16.error
    offered = {f.name: f for f in r.fixes}
    assert list(offered) == ["nms", "dynamic_output_shapes"]
    assert offered["nms"].code == NMS_CODE
    assert any(w.startswith("eager bf16 failed: ") for w in offered["nms"].reasons)
    assert not any("failed" in w for w in offered["dynamic_output_shapes"].reasons)  # it does not give bf16
    text = format_summary(r, width=200)
    assert "our fixes: nms, dynamic_output_shapes" in text
    assert "with fullgraph.models.replace_torchvision_nms():" in text
    assert r.applied == [] and "measured with" not in text
    assert r.graph_break_count == explained(model, args, torch.float32)


def test_with_nms_runs_the_bf16_row_that_failed_and_shows_the_measured_breaks(detector):
    _, model, args = detector
    r = doctor(model, args, dtypes=BOTH, with_=("nms",), **RUN)
    names = [c.name for c in r.configs]
    assert names == ["eager fp32", "eager fp32 with nms", "eager bf16", "eager bf16 with nms"]
    rows = {c.name: c for c in r.configs}
    assert rows["eager bf16"].error and rows["eager bf16 with nms"].error is None
    assert rows["eager bf16 with nms"].ok and rows["eager bf16 with nms"].median_ms > 0
    assert rows["eager bf16 with nms"].matched is not None  # judged by matched detections, as the rows as written
    assert r.recommendation.config == "eager fp32"  # rows with our fixes are measured, never recommended
    # The break counts with the fix, per dtype, are explain's with the fix (ours breaks once, at its last step).
    assert [c.dtype for c in r.applied_breaks] == ["fp32", "bf16"]
    for c, dtype in zip(r.applied_breaks, BOTH, strict=True):
        assert c.error is None
        assert c.graph_count - 1 == explained(model, args, dtype, replace_torchvision_nms())
        assert [(g.function, g.fixes) for g in c.graph_breaks] == [("batched_nms", ["dynamic_output_shapes"])]
    assert r.applied_breaks[0].graph_count - 1 < r.graph_break_count
    text = format_summary(r, width=200)
    assert "measured with nms" in text
    assert f"graph breaks, bf16: {r.applied_breaks[1].break_summary} (as written: {r.break_summary})" in text
    assert f"eager bf16: failed -> eager bf16 with nms: {rows['eager bf16 with nms'].median_ms:.3g} ms" in text
    html = render_html(r)
    assert "Measured with nms" in html and f"<td>graph breaks, bf16</td><td>{r.break_summary}</td>" in html
    assert Report.from_json(r.to_json()) == r


def test_with_both_fixes_the_nms_breaks_are_gone_as_measured(detector):
    _, model, args = detector
    r = doctor(model, args, dtypes=(torch.float32,), with_=("nms", "dynamic_output_shapes"), **RUN)
    (c,) = r.applied_breaks
    capture = torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
    assert c.graph_count - 1 == explained(model, args, torch.float32, replace_torchvision_nms(), capture) == 0
    assert r.graph_break_count > 0 and [c.name for c in r.configs][1] == "eager fp32 with nms+dynamic_output_shapes"


@pytest.mark.parametrize("detector", ["build_rcnn"], indirect=True)
def test_roi_align_failure_past_nms_gets_our_roi_align_fix_and_both_run_the_bf16_rows(detector):
    _, model, args = detector
    r = doctor(model, args, dtypes=BOTH, with_=("nms",), **RUN)
    rows = {c.name: c for c in r.configs}
    assert '"nms_kernel"' in rows["eager bf16"].error
    assert '"roi_align_forward_kernel" not implemented for' in rows["eager bf16 with nms"].error
    offered = {f.name: f for f in r.fixes}
    assert list(offered) == ["nms", "roi_align", "dynamic_output_shapes"]
    assert offered["roi_align"].code == f"with fullgraph.models.upcast_torchvision_roi_align():\n    {fixes._CALL}"
    assert [w.split(":")[0] for w in offered["roi_align"].reasons] == ["eager bf16 with nms failed"]
    assert not any("with nms failed" in w for w in offered["nms"].reasons)  # a row never offers what it ran with
    assert all(b.fixes != ["roi_align"] for b in r.breaks)  # offered for failures only, never for a break

    r = doctor(model, args, dtypes=BOTH, with_=("nms", "roi_align"), **RUN)
    rows = {c.name: c for c in r.configs}
    fixed = rows["eager bf16 with nms+roi_align"]
    assert rows["eager bf16"].error and fixed.error is None and fixed.median_ms > 0 and fixed.matched is not None
    explain_both = [explained(model, args, d, replace_torchvision_nms(), upcast_torchvision_roi_align()) for d in BOTH]
    assert [c.graph_count - 1 for c in r.applied_breaks] == explain_both
    assert "eager bf16: failed -> eager bf16 with nms+roi_align: " in format_summary(r, width=200)


def test_fixes_match_nms_frames_only():
    assert fixes.for_break(["/m/model.py:forward"], "Dynamic shape operator") == []  # the user's own mask: generic
    assert fixes.for_break(["/m/model.py:forward", "/fg/fullgraph/models/nms.py:batched_nms"], "Dynamic shape operator")
    assert fixes.for_break(["/site/torchvision/ops/boxes.py:nms"], "Dynamic shape operator") == [
        "nms",
        "dynamic_output_shapes",
    ]
    assert fixes.for_break(["/site/torchvision/ops/boxes.py:nms"], "Unsupported method call") == ["nms"]
    assert fixes.for_failure("RuntimeError: \"nms_kernel\" not implemented for 'Half'") == ["nms"]
    assert fixes.for_failure("RuntimeError: shapes do not match") == []
    roi = "NotImplementedError: \"roi_align_forward_kernel\" not implemented for 'BFloat16'"
    assert fixes.for_failure(roi) == ["roi_align"]
    assert "roi_align" not in fixes.for_break(["/site/torchvision/ops/roi_align.py:roi_align"], "anything")


def test_unknown_fix_is_a_usage_error_naming_the_known_ones():
    known = "choose from nms, roi_align, dynamic_output_shapes"
    with pytest.raises(UsageError, match=rf"with_: unknown fix 'nmx'; {known}"):
        doctor(torch.nn.Linear(2, 2), (torch.randn(1, 2),), with_=("nmx",), **RUN)


def test_with_nms_without_torchvision_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision raises ImportError
    with pytest.raises(UsageError, match=r"with_ nms: torchvision does not import here; install it"):
        doctor(torch.nn.Linear(2, 2), (torch.randn(1, 2),), with_=("nms",), **RUN)


def test_cli_with(detector, tmp_path, capsys):
    path = detector[0]
    out = ["--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")]
    assert main(["doctor", f"{path}:build", "--with", "nms,bogus", *out]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "fullgraph doctor: error: --with: unknown fix 'bogus'; choose from nms, roi_align, " + (
        "dynamic_output_shapes"
    )
    # bf16 first: the CLI's eager check runs with the fixes applied, so the row as written fails in the report.
    run = ["--mode", "eager", "--dtype", "bf16", "--reps", "3", "--no-profile", *out]
    assert main(["doctor", f"{path}:build", "--with", "nms", *run]) == 0
    r = Report.from_json((tmp_path / "r.json").read_text())
    assert [(c.name, c.error is None) for c in r.configs] == [("eager bf16", False), ("eager bf16 with nms", True)]
    assert "eager bf16: failed -> eager bf16 with nms: " in capsys.readouterr().out
    assert main(["doctor", f"{path}:build", *run]) == 2  # as written it fails in eager: the error names our fix
    assert capsys.readouterr().err.strip().endswith("--with nms measures it with our fix")
