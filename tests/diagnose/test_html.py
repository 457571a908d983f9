"""The doctor's HTML report: structure, escaping and self-containment, then a real render in headless Chromium."""

import ast
import json
import math
import os
import random
import re
import struct
import zlib
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest
from markupsafe import escape

import fullgraph.diagnose.html as html_module
import fullgraph.diagnose.schema as schema_module
from fullgraph.bench.breakdown import Breakdown, ClassTime
from fullgraph.diagnose.html import CLASS_COLOURS, HIGHLIGHT, render_html
from fullgraph.diagnose.report import ConfigResult, Finding, GraphBreak, Report
from tests.diagnose import browser
from tests.diagnose.full_report import (
    FAILED,
    HOSTILE,
    LONG_SOURCE,
    NOISY,
    RECOMMENDED,
    WRONG,
    full_report,
    model_path,
)
from tests.diagnose.surfaces import html_sections as _sections
from tests.diagnose.surfaces import html_text as _text

SECTIONS = (
    "summary",
    "chart",
    "configs",
    "breakdowns",
    "fixes",
    "graph-breaks",
    "recompiles",
    "cudagraph-skips",
    "lint",
    "output",
    "checklist",
    "notes",
)
E_HOSTILE = str(escape(HOSTILE))  # &lt;script&gt;... &amp; &#34;quoted&#34; &#39;single&#39;


class _Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(html)
    return parser.tags


def test_every_section_has_its_id_and_a_nav_link():
    html = render_html(full_report())
    tags = _tags(html)
    assert [a["id"] for tag, a in tags if tag == "section"] == list(SECTIONS)
    assert [a["href"] for tag, a in tags if tag == "a"] == [f"#{s}" for s in SECTIONS]


def test_every_section_heading_has_its_count():
    r = full_report()
    headings = {
        sid: _text(re.search(r"<h2>(.*?)</h2>", body, re.S)[1]) for sid, body in _sections(render_html(r)).items()
    }
    assert headings == {
        "summary": "Summary",
        "chart": "Latency",
        "configs": "Configurations (6)",
        "breakdowns": "Where the time goes (2)",
        "fixes": "Our fixes (1)",
        "graph-breaks": "Graph breaks (3 at 2 places)",
        "recompiles": "Recompiles (2 causes, 5 recompiles)",
        "cudagraph-skips": "CUDA-graph skips (1)",
        "lint": "Lint (1)",
        "output": "Captured output (2)",
        "checklist": "Checklist (3)",
        "notes": "Notes (1)",
    }


def test_report_text_is_escaped_everywhere():
    html = render_html(full_report())
    assert "<script" not in html
    sections = _sections(html)
    for sid in ("configs", "breakdowns", "fixes", "graph-breaks", "recompiles", "output", "notes"):
        assert E_HOSTILE in sections[sid], sid
    assert "syncs the host &amp; breaks" in sections["lint"]
    assert "max-autotune fp16 &lt;fast&gt;" in sections["chart"] and "# &lt;&amp;&gt;" in sections["graph-breaks"]
    assert 'data-config="compile max-autotune fp16 &lt;fast&gt;"' in sections["chart"]


def test_paths_are_escaped_too():
    lint = [Finding('we<ird&"/m.py', 3, 1, "FG001", "m", "f")]
    body = _sections(render_html(Report("m.py:Net", "cpu", [], {}, lint=lint)))["lint"]
    assert "we&lt;ird&amp;&#34;/<wbr>m.py:3:1" in body


def test_page_is_self_contained():
    html = render_html(full_report())
    for needle in ("http://", "https://", "<link", "<script", "src=", "url(", "@import"):
        assert needle not in html.lower(), needle
    hrefs = [a["href"] for tag, a in _tags(html) if "href" in a]
    assert hrefs and all(h.startswith("#") for h in hrefs)


def test_template_ships_as_package_data_and_html_never_imports_report():
    templates = resources.files("fullgraph.diagnose") / "templates"
    assert (templates / "report.html.j2").is_file() and (templates / "report.css.j2").is_file()
    # No cycle, not even for types (issue 34, item 7): report -> html -> schema, and schema imports neither.
    for module, banned in ((html_module, {"report"}), (schema_module, {"report", "html"})):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {f"fullgraph.diagnose.{b}" for b in banned}, (module.__name__, imported)


def test_paths_are_shown_relative_to_the_working_folder():
    r = full_report()
    html = render_html(r)
    assert model_path().startswith(os.getcwd() + os.sep)
    assert os.getcwd() not in html
    sections = {k: v.replace("<wbr>", "") for k, v in _sections(html).items()}
    line = r.graph_breaks[0].line
    assert f'<code class="loc">examples/<wbr>model.py:{line}</code>' in html  # a narrow column breaks at the /
    assert f"examples/model.py:{line}<" in sections["graph-breaks"]
    assert f"examples/model.py:{line + 3}<" in sections["recompiles"]
    assert f"examples/model.py:{line}:9<" in sections["lint"]


def test_a_long_source_line_is_shown_whole_in_its_own_row():
    breaks = _sections(render_html(full_report()))["graph-breaks"]
    assert str(escape(LONG_SOURCE)) in breaks
    row = re.search(r'<tr class="detail"><td colspan="3"><pre class="src">(.*?)</pre>', breaks, re.S)[1]
    assert row.endswith(str(escape(LONG_SOURCE)))


def test_graph_break_id_only_where_it_adds_something():
    r = full_report()
    bodies = re.findall(r'<tbody class="item">(.*?)</tbody>', _sections(render_html(r))["graph-breaks"], re.S)
    assert len(bodies) == 2
    # First break: type and id are not in the reason, so both are shown, the id once, as a badge.
    assert "<b>Data-dependent branching</b>" in bodies[0] and bodies[0].count("GB0170") == 1
    assert '<span class="badge id"' in bodies[0] and "torch's hint: use torch.cond" in bodies[0]
    # Second: the reason already names its id and type; neither is repeated, and no empty hint.
    assert bodies[1].count("GB0099") == 1 and "badge id" not in bodies[1] and "<b>builtin print" not in bodies[1]
    assert "hint" not in bodies[1]


def test_every_fix_is_in_a_fix_cell():
    r = full_report()
    html = render_html(r)
    fixes = [m for m in re.findall(r'<td class="fix">(.*?)</td>', html, re.S)]
    expected = [g.fix for g in r.graph_breaks] + [c.fix for c in r.recompiles] + [f.fix for f in r.lint]
    expected += [f.fix for b in r.breakdowns for f in b.flags]
    assert sorted(fixes) == sorted(str(escape(f)) for f in expected)


def test_tables_fit_the_page():
    html = render_html(full_report())
    assert re.search(r"table \{[^}]*table-layout: fixed", html) and "overflow-x" not in html
    for table in re.findall(r"<table.*?</table>", html, re.S):
        widths = [float(w) for w in re.findall(r'<col style="width: ([\d.]+)%">', table)]
        heads = re.search(r"<thead><tr>(.*?)</tr></thead>", table, re.S)[1].count("<th")
        assert len(widths) == heads and abs(sum(widths) - 100) < 1e-9, table[:80]


def test_one_bar_per_config_and_only_the_recommended_one_highlighted():
    report = full_report()
    bars = [a for tag, a in _tags(render_html(report)) if tag == "rect" and "bar" in (a.get("class") or "").split()]
    assert [b["data-config"] for b in bars] == [c.name for c in report.configs]
    highlighted = [b for b in bars if b.get("fill") == HIGHLIGHT]
    assert [b["data-config"] for b in highlighted] == [RECOMMENDED]
    assert "recommended" in highlighted[0]["class"].split()
    assert {b["data-config"] for b in bars if "greyed" in b["class"].split()} == {WRONG, FAILED}
    assert [b["data-config"] for b in bars if "noisy" in b["class"].split()] == [NOISY]
    assert HIGHLIGHT not in "".join(v for k, v in _sections(render_html(report)).items() if k != "chart")


def test_bar_lengths_follow_median():
    report = full_report()
    bars = {a["data-config"]: a for tag, a in _tags(render_html(report)) if tag == "rect" and "data-config" in a}
    timed = sorted((c for c in report.configs if c.median_ms is not None), key=lambda c: c.median_ms)
    widths = [float(bars[c.name]["width"]) for c in timed]
    assert widths == sorted(widths) and widths[0] > 0


def test_noisy_rows_are_marked_with_their_spread():
    r = full_report()
    noisy = next(c for c in r.configs if c.noisy)
    sections = _sections(render_html(r))
    assert f"noisy, spread {100 * noisy.spread:.0f}%" in _text(sections["chart"])
    rows = re.findall(r'<tbody class="item([^"]*)">(.*?)</tbody>', sections["configs"], re.S)
    assert [cls for cls, _ in rows].count(" noisy") == 1
    body = next(b for cls, b in rows if "noisy" in cls)
    assert NOISY in body and f"noisy {100 * noisy.spread:.0f}% {noisy.rounds} rounds" in _text(body)
    assert sum("badge warn" in b for _, b in rows) == 1


def test_summary_recommendation_tie_reason_and_timing():
    r = full_report()
    sections = _sections(render_html(r))
    summary = _text(sections["summary"])
    assert "examples/model.py:Net" in summary and "NVIDIA H200" in summary and "4x3x224x224:float32" in summary
    assert f"use {RECOMMENDED}, {r.recommendation.speedup:.2f}× the speed of eager fp32" in summary
    assert f"why: {r.recommendation.reason}" in summary
    assert f"tie {RECOMMENDED} and {NOISY} are within 3% or within noise of the fastest" in summary
    assert "model = torch.compile(model, mode=&#34;max-autotune&#34;)" in sections["summary"]
    assert "5 recompiles" in summary  # the stat counts guard failures, not causes
    assert "timing: threads 2 · rounds 5 · method CUDA events, interleaved rounds" in _text(sections["configs"])
    assert "none found" not in "".join(sections.values())


def test_recompiles_show_their_count():
    r = full_report()
    text = _text(_sections(render_html(r))["recompiles"])
    assert "batch ×3" in text and "dtype ×2" in text
    one = Report("m.py:Net", "cpu", [], {}, recompiles=[r.recompiles[0].__class__("f", "m.py", 3, "seq", "g", "x")])
    assert "×" not in _text(_sections(render_html(one))["recompiles"])


def test_breakdowns_bars_tables_and_flags():
    r = full_report()
    html = render_html(r)
    section = _sections(html)["breakdowns"]
    blocks = section.split('<div class="breakdown">')[1:]
    assert len(blocks) == len(r.breakdowns) == 2
    for b, block in zip(r.breakdowns, blocks, strict=True):
        segments = [a for tag, a in _tags(block) if tag == "rect" and a.get("class") == "segment"]
        assert [s["data-class"] for s in segments] == [c.name for c in b.classes] + ["idle"]
        assert [s["fill"] for s in segments[:-1]] == [CLASS_COLOURS[c.name] for c in b.classes]
        widths = [float(s["width"]) for s in segments]
        svg_width = float(next(a for tag, a in _tags(block) if tag == "svg")["width"])
        assert abs(sum(widths) - svg_width) <= 1  # the classes and the idle time fill the call's wall time
        for c, w in zip(b.classes, widths[:-1], strict=True):
            assert abs(w - svg_width * c.ms / b.call_ms) <= 0.1
        text = _text(block)
        assert f"GPU idle {100 * b.idle_share:.0f}%" in text and f"{html_module.num(b.call_ms)} ms wall" in text
        gemm = b.classes[0]
        assert f"gemm {html_module.num(gemm.ms)} ms · {100 * gemm.share:.0f}%" in text  # the legend
        assert f"{html_module.num(gemm.rate)} TFLOP/s" in text and f"{gemm.pct_of_ceiling:.0f}%" in text
        assert all(str(escape(k.name)) in block for k in b.top) and "aten::addmm &lt;- model.py:41" in block
        assert all(str(escape(f.fix)) in block and f.kind in block for f in b.flags)


def test_breakdown_on_the_cpu_has_no_idle_segment():
    b = Breakdown(
        "eager fp32", "cpu", 4.0, 3.0, None, [ClassTime("gemm", 2.0, 2 / 3, 4), ClassTime("other", 1.0, 1 / 3, 9)]
    )
    block = _sections(render_html(Report("m.py:Net", "cpu", [], {}, breakdowns=[b])))["breakdowns"]
    assert [a["data-class"] for tag, a in _tags(block) if tag == "rect"] == ["gemm", "other"]
    assert "idle" not in block and "in ops" in _text(block)


def test_empty_report_says_none_found():
    sections = _sections(render_html(Report("m.py:Net", "cpu", [], {})))
    assert set(sections) == set(SECTIONS)
    assert all("none found" in body for body in sections.values())
    assert "<svg" not in sections["chart"]


def test_all_failed_configs_still_chart():
    configs = [ConfigResult(f"cfg {i}", "default", "float32", error="OOM") for i in range(3)]
    html = render_html(Report("m.py:Net", "cpu", [], {}, configs=configs))
    assert sum(1 for tag, a in _tags(html) if tag == "rect" and "data-config" in a) == 3


def test_json_round_trip():
    report = full_report()
    again = Report.from_json(report.to_json())
    assert again == report and json.loads(again.to_json()) == json.loads(report.to_json())
    assert render_html(again) == render_html(report)


def test_a_break_torch_ships_no_registry_entry_for():
    g = GraphBreak("m.py", 3, "f", "x.item()", "Tensor.item", "", "", "", "keep it a tensor")
    body = _sections(render_html(Report("m.py:Net", "cpu", [], {}, graph_breaks=[g], graph_count=2)))["graph-breaks"]
    assert "badge id" not in body and "<b>" not in body and "Tensor.item" in body


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c  # the spec's form, unlike the decoder's, so a shared slip cannot hide
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _encode_png(rows: list[bytes], width: int, channels: int) -> bytes:
    """A PNG whose row y uses filter y % 5, so every filter type is undone by the decoder under test."""
    raw, prev = bytearray(), bytes(width * channels)
    for y, row in enumerate(rows):
        kind = y % 5
        raw.append(kind)
        for i, v in enumerate(row):
            a, b, c = (row[i - channels], prev[i], prev[i - channels]) if i >= channels else (0, prev[i], 0)
            raw.append((v - (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]) & 0xFF)
        prev = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, len(rows), 8, 2 if channels == 3 else 6, 0, 0, 0)
    return browser.PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("channels", [3, 4])
def test_png_decoder_undoes_every_filter(channels):
    width, height = 7, 11
    rows = [bytes(random.randrange(256) for _ in range(width * channels)) for _ in range(height)]
    data = _encode_png(rows, width, channels)
    image = browser.decode_png(data)
    assert (image.width, image.height, image.channels, image.rows) == (width, height, channels, rows)
    broken = bytearray(data)
    broken[40] ^= 0xFF  # inside the IDAT chunk
    with pytest.raises(ValueError, match="CRC"):
        browser.decode_png(bytes(broken))


@pytest.mark.browser
def test_renders_in_headless_chromium(tmp_path):
    chromium = browser.find_chromium()
    page = tmp_path / "report.html"
    page.write_text(render_html(full_report()), encoding="utf-8")

    png = browser.screenshot(chromium, page, tmp_path / "report.png")
    data = png.read_bytes()
    assert data.startswith(browser.PNG_SIGNATURE) and len(data) > 8_000
    image = browser.decode_png(data)
    assert (image.width, image.height) == browser.WINDOW

    layout = browser.rendered_layout(chromium, page)
    boxes = layout.boxes
    chart = [b for b in boxes if b.tag == "svg" and b.section == "chart"]
    configs = [b for b in boxes if b.tag == "table" and b.section == "configs"]
    assert len(chart) == 1 and len(configs) == 1, boxes
    for box in (chart[0], configs[0]):
        assert box.width > 100 and box.height > 50, box
    assert chart[0].top + chart[0].height <= image.height, "chart falls below the screenshot"

    highlight = tuple(int(HIGHLIGHT[i : i + 2], 16) for i in (1, 3, 5))
    assert image.count_colour(highlight, chart[0]) > 200

    # Nothing sideways: every table and every fix cell ends inside the 1280 px window, no horizontal scrollbar.
    assert layout.client_width <= browser.WINDOW[0] and layout.scroll_width <= layout.client_width, layout
    fixes = [b for b in boxes if b.tag == "td" and "fix" in b.cls.split()]
    assert {b.section for b in fixes} == {"breakdowns", "graph-breaks", "recompiles", "lint"}
    for box in [*fixes, *(b for b in boxes if b.tag == "table")]:
        assert box.width > 40 and box.right <= layout.client_width, box
    bars = [b for b in boxes if b.tag == "svg" and b.section == "breakdowns"]
    assert len(bars) == 2 and all(b.right <= layout.client_width and b.width > 800 for b in bars), bars


def test_a_row_whose_output_did_not_match_at_all_saves_as_strict_json_and_reads_back():
    # rel_err is inf where the outputs cannot be compared (greedy tokens that differ in bf16, NaN, another shape):
    # writing it failed ("Out of range float values are not JSON compliant") and the doctor's run with it
    mismatch = ConfigResult("compile default bf16", "default", "bf16", 2.0, 1.9, 2.1, rel_err=math.inf, tolerance=4e-2)
    nan = ConfigResult("eager bf16", "eager", "bf16", 3.0, 2.9, 3.1, rel_err=math.nan, tolerance=4e-2)
    report = Report("m.py:Net", "cpu", [], {}, configs=[mismatch, nan])
    text = report.to_json()
    strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert [c["rel_err"] for c in strict["configs"]] == ["inf", "nan"]
    again = Report.from_json(text)
    assert again.configs[0].rel_err == math.inf and math.isnan(again.configs[1].rel_err)
    assert not again.configs[0].ok and not again.configs[1].ok
    assert render_html(again) == render_html(report)
