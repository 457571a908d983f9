"""The doctor's HTML report: structure, escaping and self-containment, then a real render in headless Chromium."""

import random
import re
import struct
import zlib
from html.parser import HTMLParser

import pytest

from fullgraph.diagnose.html import HIGHLIGHT, render_html
from fullgraph.diagnose.report import (
    ChecklistItem,
    ConfigResult,
    Finding,
    GraphBreak,
    Recommendation,
    Recompile,
    Report,
)
from tests.diagnose import browser

SECTIONS = (
    "summary",
    "chart",
    "configs",
    "graph-breaks",
    "recompiles",
    "cudagraph-skips",
    "lint",
    "checklist",
    "notes",
)
HOSTILE = """<script>alert(1)</script> & "quoted" 'single'"""


def _timed(name: str, mode: str, dtype: str, median: float, rel_err: float, tol: float) -> ConfigResult:
    spread = random.uniform(0.02, 0.15) * median
    return ConfigResult(
        name,
        mode,
        dtype,
        median_ms=median,
        p20_ms=median - spread,
        p80_ms=median + random.uniform(0.5, 1.5) * spread,
        compile_s=None if mode == "eager" else random.uniform(5, 90),
        peak_memory_bytes=random.randrange(2**28, 2**33),
        rel_err=rel_err,
        tolerance=tol,
    )


def _report() -> Report:
    """A full report with fresh numbers: the fastest in-tolerance compiled config is the recommendation."""
    eager = random.uniform(8, 40)
    fast = eager / random.uniform(2.0, 3.5)
    configs = [
        _timed("eager fp32", "eager", "float32", eager, 0.0, 1e-5),
        _timed("compile default fp32", "default", "float32", eager / random.uniform(1.1, 1.5), 3e-7, 1e-5),
        _timed("compile max-autotune bf16", "max-autotune", "bfloat16", fast, random.uniform(1e-3, 5e-3), 1e-2),
        # Faster still but wrong: must be greyed, never recommended.
        _timed("compile max-autotune fp16 <fast>", "max-autotune", "float16", fast * 0.8, 0.2, 1e-2),
        ConfigResult("compile reduce-overhead bf16", "reduce-overhead", "bfloat16", error=f"RuntimeError: {HOSTILE}"),
    ]
    line = random.randrange(10, 400)
    breaks = [
        GraphBreak(
            "model.py", line, "forward", "if x.sum() > 0 and y < 3:", f"data-dependent branch {HOSTILE}",
            "GB0170", "Data-dependent branching", "use torch.cond", "replace the branch with torch.where",
        ),
        GraphBreak("attn.py", line + 7, "attend", "print(x.shape)", "print() call", "", "", "", "delete the print"),
    ]  # fmt: skip
    return Report(
        target="examples/model.py:Net",
        device="cuda:0",
        inputs=["4x3x224x224:float32", "4:int64"],
        environment={"gpu": "NVIDIA H200", "torch": "2.13.0", "triton": "3.6.0", "attention": [{"name": "flash"}]},
        lint=[Finding("model.py", line, 9, "FG001", "`.item()` syncs the host & breaks graphs", "keep it a tensor")],
        graph_count=3,
        graph_breaks=breaks,
        recompiles=[
            Recompile("forward", "model.py", line, "batch", "L['x'].size()[0] == 4", "mark the batch dim dynamic"),
            Recompile("attend", "attn.py", line + 3, "dtype", "L['q'].dtype == torch.float32", "cast once at entry"),
        ],
        cudagraph_skips=["mutated inputs in forward (model.py:12)"],
        configs=configs,
        recommendation=Recommendation(
            "compile max-autotune bf16", eager / fast, 'model = torch.compile(model, mode="max-autotune")', "eager fp32"
        ),
        checklist=[
            ChecklistItem("no graph breaks", "fail", "2 breaks"),
            ChecklistItem("outputs within tolerance", "pass", "rel err 2e-3 <= 1e-2"),
            ChecklistItem("CUDA graphs replay", "not-measured", "reduce-overhead failed"),
        ],
        notes=[f"note with {HOSTILE}"],
    )


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


def _sections(html: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', html, re.S))


def test_every_section_has_its_id():
    html = render_html(_report())
    ids = [a["id"] for tag, a in _tags(html) if tag == "section"]
    assert ids == list(SECTIONS)


def test_report_text_is_escaped():
    html = render_html(_report())
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quoted&quot; &#x27;single&#x27;" in html
    assert "<script" not in html
    assert "syncs the host &amp; breaks" in html
    assert "max-autotune fp16 &lt;fast&gt;" in html


def test_page_is_self_contained():
    html = render_html(_report())
    for needle in ("http://", "https://", "<link", "<script", "src=", "url(", "@import"):
        assert needle not in html.lower(), needle
    hrefs = [a["href"] for tag, a in _tags(html) if "href" in a]
    assert hrefs and all(h.startswith("#") for h in hrefs)


def test_one_bar_per_config_and_only_the_recommended_one_highlighted():
    report = _report()
    bars = [a for tag, a in _tags(render_html(report)) if tag == "rect" and "bar" in (a.get("class") or "").split()]
    assert [b["data-config"] for b in bars] == [c.name for c in report.configs]
    highlighted = [b for b in bars if b.get("fill") == HIGHLIGHT]
    assert [b["data-config"] for b in highlighted] == [report.recommendation.config]
    assert "recommended" in highlighted[0]["class"].split()
    greyed = {b["data-config"] for b in bars if "greyed" in b["class"].split()}
    assert greyed == {"compile max-autotune fp16 <fast>", "compile reduce-overhead bf16"}


def test_bar_lengths_follow_median():
    report = _report()
    bars = {a["data-config"]: a for tag, a in _tags(render_html(report)) if tag == "rect" and "data-config" in a}
    timed = sorted((c for c in report.configs if c.median_ms is not None), key=lambda c: c.median_ms)
    widths = [float(bars[c.name]["width"]) for c in timed]
    assert widths == sorted(widths) and widths[0] > 0


def test_summary_tables_and_missing_values():
    report = _report()
    sections = _sections(render_html(report))
    summary = sections["summary"]
    assert "examples/model.py:Net" in summary and "NVIDIA H200" in summary and "4x3x224x224:float32" in summary
    assert f"{report.recommendation.speedup:.2f}×" in summary
    assert "model = torch.compile(model, mode=&quot;max-autotune&quot;)" in summary
    assert sections["configs"].count("<tr>") + sections["configs"].count('<tr class="recommended">') == 6
    assert "–" in sections["configs"]  # the failed config has no median
    assert "GB0170" in sections["graph-breaks"] and "model.py:" in sections["graph-breaks"]
    assert "L[&#x27;x&#x27;].size()[0] == 4" in sections["recompiles"]
    assert f"model.py:{report.lint[0].line}:9" in sections["lint"]
    for status in ("pass", "fail", "not-measured"):
        assert f">{status}</span>" in sections["checklist"]
    assert all("none found" not in body for name, body in sections.items() if name != "summary")


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
    report = _report()
    assert Report.from_json(report.to_json()) == report
    assert render_html(Report.from_json(report.to_json())) == render_html(report)


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
    page.write_text(render_html(_report()), encoding="utf-8")

    png = browser.screenshot(chromium, page, tmp_path / "report.png")
    data = png.read_bytes()
    assert data.startswith(browser.PNG_SIGNATURE) and len(data) > 8_000
    image = browser.decode_png(data)
    assert (image.width, image.height) == browser.WINDOW

    boxes = browser.rendered_boxes(chromium, page)
    chart = [b for b in boxes if b.tag == "svg" and b.section == "chart"]
    configs = [b for b in boxes if b.tag == "table" and b.section == "configs"]
    assert len(chart) == 1 and len(configs) == 1, boxes
    for box in (chart[0], configs[0]):
        assert box.width > 100 and box.height > 50, box
    assert chart[0].top + chart[0].height <= image.height, "chart falls below the screenshot"

    highlight = tuple(int(HIGHLIGHT[i : i + 2], 16) for i in (1, 3, 5))
    assert image.count_colour(highlight, chart[0]) > 200
