"""Drive headless Chromium over a local HTML file: a screenshot, and the DOM with measured on-screen sizes.

Also a small stdlib PNG decoder (8-bit RGB/RGBA, non-interlaced, all five filters), so a test can look at the
screenshot's pixels without Pillow or numpy.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

TIMEOUT_S = 60
WINDOW = (1280, 2000)
# Headless and offline: no GPU, no sandbox (CI runs as root), nothing that phones home or updates itself.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
)
# Injected into a copy of the page only for the DOM check; the report itself carries no script. It runs last in
# <body>, when layout is final (the page loads nothing), and records the boxes of the chart SVGs, the tables and the
# fix cells, and on <html> the width of the layout viewport and of everything laid out (wider: a sideways scrollbar).
MEASURE_SCRIPT = """<script>
for (const e of document.querySelectorAll("#chart svg, svg.stacked, table, td.fix")) {
  const r = e.getBoundingClientRect();
  e.setAttribute("data-rendered-section", e.closest("section").id);
  for (const k of ["left", "top", "width", "height"]) e.setAttribute("data-rendered-" + k, r[k]);
}
const root = document.documentElement;
root.setAttribute("data-rendered-client-width", root.clientWidth);
root.setAttribute("data-rendered-scroll-width", root.scrollWidth);
</script>"""


def find_chromium() -> str:
    """Chromium's path, or skip: CI installs it in .ci/run; a local machine may not have it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("needs chromium or chromium-browser on PATH (apt-get install chromium)")
    return path


def run_chromium(chromium: str, *args: str) -> str:
    """Run Chromium with a fresh profile and return its stdout; fail the test with its stderr on any error."""
    with tempfile.TemporaryDirectory(prefix="fullgraph-chromium-") as profile:
        cmd = [chromium, *FLAGS, f"--user-data-dir={profile}", *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
            pytest.fail(f"chromium timed out after {TIMEOUT_S}s: {cmd}\n--- stderr ---\n{stderr}")
    if done.returncode != 0:
        pytest.fail(f"chromium exited {done.returncode}: {cmd}\n--- stderr ---\n{done.stderr}")
    return done.stdout


def screenshot(chromium: str, page: Path, png: Path) -> Path:
    run_chromium(chromium, f"--screenshot={png}", page.resolve().as_uri())
    if not png.is_file():
        pytest.fail(f"chromium exited cleanly but wrote no screenshot at {png}")
    return png


@dataclass(frozen=True)
class Box:
    """An element's on-screen box in CSS pixels (one CSS pixel is one screenshot pixel at scale 1)."""

    tag: str
    section: str
    left: float
    top: float
    width: float
    height: float
    cls: str = ""  # the element's class attribute

    @property
    def right(self) -> float:
        return self.left + self.width


@dataclass(frozen=True)
class Layout:
    boxes: list[Box]
    client_width: float  # the layout viewport, less a vertical scrollbar
    scroll_width: float  # everything laid out; more than client_width means a horizontal scrollbar


class _Boxes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.boxes: list[Box] = []
        self.widths = (float("nan"), float("nan"))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if "data-rendered-section" in a:
            dims = (float(a[f"data-rendered-{k}"] or "nan") for k in ("left", "top", "width", "height"))
            self.boxes.append(Box(tag, a["data-rendered-section"] or "", *dims, cls=a.get("class") or ""))
        if tag == "html" and "data-rendered-client-width" in a:
            self.widths = tuple(float(a[f"data-rendered-{k}-width"] or "nan") for k in ("client", "scroll"))


def rendered_layout(chromium: str, page: Path) -> Layout:
    """Load a copy of `page` with MEASURE_SCRIPT added, dump the DOM and read back the measured boxes and widths."""
    html = page.read_text(encoding="utf-8")
    if "</body>" not in html:
        pytest.fail(f"{page} has no </body> to put the measuring script before")
    measured = page.with_name(page.stem + ".measured.html")
    measured.write_text(html.replace("</body>", MEASURE_SCRIPT + "</body>", 1), encoding="utf-8")
    parser = _Boxes()
    parser.feed(run_chromium(chromium, "--dump-dom", measured.resolve().as_uri()))
    return Layout(parser.boxes, *parser.widths)


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int  # 3 for RGB, 4 for RGBA
    rows: list[bytes]  # unfiltered scanlines, `width * channels` bytes each

    def count_colour(self, rgb: tuple[int, int, int], box: Box, tol: int = 8) -> int:
        """Pixels inside `box` whose R, G and B are each within `tol` of `rgb` (antialiased edges fall outside)."""
        x0, y0 = max(int(box.left), 0), max(int(box.top), 0)
        x1, y1 = min(int(box.left + box.width), self.width), min(int(box.top + box.height), self.height)
        n, c = 0, self.channels
        for row in self.rows[y0:y1]:
            for i in range(x0 * c, x1 * c, c):
                if abs(row[i] - rgb[0]) <= tol and abs(row[i + 1] - rgb[1]) <= tol and abs(row[i + 2] - rgb[2]) <= tol:
                    n += 1
        return n


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def decode_png(data: bytes) -> Image:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG, checking every chunk's CRC."""
    if data[:8] != PNG_SIGNATURE:
        raise ValueError("not a PNG: bad signature")
    pos, header, idat = 8, None, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"PNG chunk {kind!r} at byte {pos}: CRC mismatch")
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None or not idat:
        raise ValueError("PNG without IHDR or IDAT")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        raise ValueError(f"unsupported PNG: bit depth {depth}, colour type {colour}, interlace {interlace}")
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = zlib.decompress(b"".join(idat))
    if len(raw) != height * (stride + 1):
        raise ValueError(f"PNG data is {len(raw)} bytes, expected {height * (stride + 1)}")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(raw[start], line, prev, channels)
        rows.append(bytes(line))
        prev = line
    return Image(width, height, channels, rows)


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    """Undo one scanline's filter in place (PNG spec §9): each byte was stored minus a predictor of it."""
    n = len(line)
    if kind == 0:  # None
        return
    if kind == 1:  # Sub: left neighbour
        for i in range(bpp, n):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:  # Up: the byte above
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
    elif kind == 3:  # Average of left and above, rounded down
        for i in range(n):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif kind == 4:  # Paeth: whichever of left, above, upper-left is closest to left + above - upper-left
        for i in range(n):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            line[i] = (line[i] + pred) & 0xFF
    else:
        raise ValueError(f"unknown PNG filter type {kind}")
