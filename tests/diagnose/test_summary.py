"""The doctor's terminal summary: every section with its count, paths relative, text literal, plain off a terminal."""

import dataclasses
import io
import os
import re

from rich.console import Console

from fullgraph.bench.kernel_classes import short_name
from fullgraph.diagnose.html import render_html
from fullgraph.diagnose.report import GraphBreak, Recompile, Report
from fullgraph.diagnose.summary import LOG_WIDTH, format_summary, print_summary
from tests.diagnose.full_report import HOSTILE, LONG_SOURCE, NOISY, RECOMMENDED, WRONG, full_report

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
WIDE = 1000  # wide enough that nothing wraps


def _row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def _entry(text: str, first: str) -> list[str]:
    """The lines of one list entry: the line starting with `first`, then the lines indented deeper than it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    indent = len(first) - len(first.lstrip())
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        entry.append(line)
    return entry


def test_plain_text_within_the_width():
    for width in (80, 100, 140):
        text = format_summary(full_report(), width=width)
        assert "\x1b" not in text
        assert max(len(line) for line in text.splitlines()) <= width, width


def test_sections_with_their_counts():
    r = full_report()
    text = format_summary(r, width=WIDE)
    assert text.startswith("fullgraph doctor: examples/model.py:Net on cuda:0, inputs 4x3x224x224:float32, 4:int64")
    for heading in (
        "configurations: 6",
        f"recommendation: {RECOMMENDED}, {r.recommendation.speedup:.2f}x eager fp32",
        "graph breaks: 3 at 2 places (4 graphs captured, as explain counts)",
        "recompiles: 5 from 2 causes",
        "CUDA-graph skips: 1",
        "lint findings: 1",
        "where the time goes: eager fp32 on cuda",
        f"where the time goes: {RECOMMENDED} on cuda",
        "captured output: 2",
        "checklist:",
    ):
        assert re.search(rf"^{re.escape(heading)}", text, re.M), heading
    assert "timing: threads 2 · rounds 5 · method CUDA events, interleaved rounds" in text


def test_configurations_table_marks_noisy_recommended_and_failed_rows():
    r = full_report()
    text = format_summary(r, width=WIDE)
    noisy = next(c for c in r.configs if c.noisy)
    assert f"noisy {100 * noisy.spread:.0f}%" in _row(text, NOISY)
    assert _row(text, RECOMMENDED + " ").rstrip().endswith("recommended")
    assert _row(text, WRONG).rstrip().endswith("over tolerance")
    failed = next(c for c in r.configs if c.error)
    assert _row(text, failed.name).rstrip().endswith("failed")
    assert f"  {failed.name} failed: RuntimeError: {HOSTILE}" in text
    assert f"  why: {r.recommendation.reason}" in text
    assert f"  tie: {RECOMMENDED} and {NOISY} are within 3% or within noise of the fastest" in text
    assert '    model = torch.compile(model, mode="max-autotune")' in text


def test_breaks_show_relative_path_whole_source_reason_and_fix():
    r = full_report()
    g = r.graph_breaks[0]
    for width in (80, 100, WIDE):
        text = format_summary(r, width=width)
        assert os.getcwd() not in text
        entry = _entry(text, f"  examples/model.py:{g.line} in forward")
        assert all(line.startswith("    ") for line in entry[1:])  # wrapped lines keep their indent
        body = " ".join(" ".join(entry[1:]).split())
        assert body.startswith(" ".join(LONG_SOURCE.split()))  # whole, on lines of its own where it wraps
        assert f"data-dependent branch {HOSTILE} [GB0170]" in body and body.endswith(f"fix: {g.fix}")
        assert "torch's hint: use torch.cond" in body
    wide = format_summary(r, width=WIDE)
    assert f"\n    {LONG_SOURCE}\n" in wide  # on one line when it fits
    assert _entry(wide, f"  examples/model.py:{g.line + 7} in attend")[1:] == [
        "    print(x.shape)",
        "    Unsupported builtin print() [GB0099]",  # the reason names its id: not repeated, no empty hint
        "    fix: delete the print",
    ]


def test_recompiles_lint_breakdowns_output_and_checklist():
    r = full_report()
    text = format_summary(r, width=WIDE)
    line = r.graph_breaks[0].line
    first = _row(text, f"examples/model.py:{line} ")
    assert re.fullmatch(rf"examples/model\.py:{line} +batch ×3 +in forward +mark the batch dim dynamic", first)
    assert "L['x'].size()[0] == 4" in text.splitlines()[text.splitlines().index(first) + 1]
    assert "dtype ×2" in text and f"L['q'].dtype == torch.float32 {HOSTILE}" in text
    assert re.search(rf"^examples/model\.py:{line}:9 +FG001 +`\.item\(\)` syncs the host & breaks graphs", text, re.M)
    for b in r.breakdowns:
        assert (
            f"{b.call_ms:.3g} ms per call, {b.kernel_ms:.3g} ms in GPU kernels, GPU idle {100 * b.idle_share:.0f}%"
            in text
        )
        for c in b.classes:
            assert re.search(rf"^{c.name} +{re.escape(f'{c.ms:.3g}')} +{100 * c.share:.0f}% +{c.kernels}\b", text, re.M)
        for f in b.flags:
            assert re.search(
                rf"^{f.kind} +{re.escape(f'{f.ms:.3g}')} +{re.escape(f.message)} +{re.escape(f.fix)}$", text, re.M
            )
        assert all(short_name(k.name) in text for k in b.top)  # without template arguments and parameters
    assert all(f"  {line}" in text for line in r.output)
    assert re.search(r"^fail +no graph breaks +2 breaks$", text, re.M)
    assert f"note: note with {HOSTILE}" in text


def test_report_text_is_never_markup():
    g = GraphBreak("m.py", 3, "f", "x[bold] = 1  # [/bold]", "[red]not red[/red]", "", "", "", "use [link]x[/link]")
    text = format_summary(Report("m.py:Net", "cpu", [], {}, graph_breaks=[g], graph_count=2), width=WIDE)
    assert "x[bold] = 1  # [/bold]" in text and "[red]not red[/red]" in text and "fix: use [link]x[/link]" in text


def test_an_empty_report():
    text = format_summary(Report("m.py:Net", "cpu", [], {}))
    assert "graph breaks: 0 (0 graphs captured, as explain counts)" in text
    assert "recommendation: none (no configuration ran within tolerance)" in text
    assert "recompiles: 0" in text and "lint findings: 0" in text and "configurations: 0" in text
    assert "where the time goes" not in text and "captured output" not in text


def test_print_summary_styles_a_terminal_and_says_the_same():
    r = full_report()
    buf = io.StringIO()
    print_summary(r, Console(file=buf, force_terminal=True, color_system="standard", width=100))
    styled = buf.getvalue()
    assert "\x1b[" in styled
    plain = "\n".join(line.rstrip() for line in ANSI.sub("", styled).splitlines())
    assert plain == format_summary(r, width=100)


def test_print_summary_off_a_terminal_is_plain_stdout(capsys):
    print_summary(full_report())
    out, err = capsys.readouterr()
    assert err == "" and "\x1b" not in out and "recommendation: " in out
    assert max(len(line) for line in out.splitlines()) <= LOG_WIDTH


def test_one_cause_is_one_cause():
    """Issue 34, item 7: "recompiles: 3 from 1 cause", never "1 causes"."""
    cause = Recompile("forward", "m.py", 3, "batch", "size mismatch at index 0", "declare it dynamic", count=3)
    text = format_summary(dataclasses.replace(full_report(), recompiles=[cause]), width=WIDE)
    assert re.search(r"^recompiles: 3 from 1 cause$", text, re.M), text
    page = render_html(dataclasses.replace(full_report(), recompiles=[cause]))
    assert 'Recompiles <span class="count">(1 cause, 3 recompiles)</span>' in page
