"""The doctor's report as data: frozen dataclasses with a JSON round trip (schema in docs/doctor.md).

Every section is data; rendering (terminal, JSON, HTML) lives elsewhere and reads only these fields. `report.py`
adds saving as HTML on top; `html.py` reads these types from here, so the two never import each other.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Self

from fullgraph._files import write_atomic
from fullgraph.bench.breakdown import Breakdown

SCHEMA_VERSION = 2
# Strict JSON has no infinity or NaN; a row whose output did not match at all has rel_err inf. Written as these
# strings, read back as the floats (ConfigResult's float fields only). No earlier version-2 file holds them: writing
# one failed ("Out of range float values are not JSON compliant").
NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


@dataclass(frozen=True)
class Finding:
    """One lint finding: where, which rule, what is wrong and how to fix it."""

    path: str
    line: int
    col: int
    rule: str  # rule id, e.g. "FG001"
    message: str
    fix: str


@dataclass(frozen=True)
class GraphBreak:
    """One graph break from a real Dynamo run, located in the user's code."""

    file: str
    line: int
    function: str
    source: str  # the user's source line, stripped
    reason: str  # Dynamo's reason, first line
    gb_id: str  # torch's graph-break registry id ("GB0123"), "" where torch ships none
    gb_type: str  # the registry's short name for the break
    hint: str  # torch's hint, where the registry has one
    fix: str  # ours
    count: int = 1  # times this place broke the graph in one call (a break in a per-image loop: once per image)
    skipped: str = ""  # why Dynamo skipped the whole function and ran it eagerly here; "" for an ordinary break
    fixes: list[str] = field(default_factory=list)  # our fixes that remove it (diagnose.fixes: the --with names)
    code: str = ""  # the code that applies them, where there are any


def plural(n: int, word: str) -> str:
    """ "1 place", "2 places"."""
    return f"{n} {word if n == 1 else word + 's'}"


def break_count(graph_count: int, breaks: list[GraphBreak]) -> int:
    """explain's count (graphs less one) when it is sane (>= 0), else the ordinary breaks' hits; never a skip."""
    if graph_count >= 1:
        return graph_count - 1
    return sum(g.count for g in breaks if not g.skipped)


def break_summary(graph_count: int, breaks: list[GraphBreak]) -> str:
    """ "8 graph breaks at 2 places" (or "0 graph breaks"): the one wording of the count, with its places."""
    n = break_count(graph_count, breaks)
    places = len([g for g in breaks if not g.skipped])
    return plural(n, "graph break") + (f" at {plural(places, 'place')}" if places else "")


@dataclass(frozen=True)
class Recompile:
    """One cause of recompilation: the guard that failed, on which variation of the inputs, and the fix.

    Guard failures with the same cause (one per graph fragment of a broken function, or repeated over calls)
    are folded into one entry; `count` says how many there were."""

    function: str  # user-facing: "forward", or "forward (after the break at line 32)" for a resumed fragment
    file: str
    line: int
    trigger: str  # what was varied: "batch", "seq", "dtype", or "inputs" (the given inputs themselves)
    guard_failure: str
    fix: str
    count: int = 1  # guard failures folded into this cause


@dataclass(frozen=True)
class ConfigResult:
    """One way of running the model (eager or a compile mode, one dtype), measured side by side."""

    name: str  # "eager fp32", "compile max-autotune bf16"
    mode: str  # "eager" or the torch.compile mode
    dtype: str
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    compile_s: float | None = None  # first call, compilation included
    peak_memory_bytes: int | None = None
    rel_err: float | None = None  # against eager fp32: ||out - ref|| / ||ref||
    tolerance: float | None = None  # the bound rel_err was held to for this dtype
    error: str | None = None  # why it could not run, if it could not
    rounds: int = 0  # interleaved timing rounds this row took part in
    spread: float | None = None  # round-to-round spread of the median: (max - min) / median over the rounds
    noisy: bool = False  # p80/p20 or round-to-round spread too wide even after re-measuring
    round_ms: list[float] = field(default_factory=list)  # median per interleaved round, in round order
    ops: dict[str, str] = field(default_factory=dict)  # op policies the row ran under; {} = every op's default
    rewrites: dict[str, int] = field(default_factory=dict)  # graph rewrites fullgraph.compile applied: name -> places
    rewrites_off: bool = False  # built with rewrites=[]: plain torch.compile's graph (the twin of a rewrite row)
    # Detection-list outputs (diagnose.detections): the fraction of detections matched against eager fp32, and the
    # fraction the row must reach; integer-only outputs (token ids, labels): the fraction of elements equal to eager
    # fp32's, all of which must be; None for other outputs, judged by rel_err alone.
    matched: float | None = None
    matched_min: float | None = None
    fixes: list[str] = field(default_factory=list)  # our fixes the row ran with (--with); never recommended
    # A model drawing random numbers in forward (diagnose.rng): "seeded" (checked with torch's generators seeded as
    # the reference's were), "seeded, fallback_random" (a compiled row checked through a compile drawing as eager
    # does); "" for a model that draws none
    rng: str = ""

    @property
    def ok(self) -> bool:
        if self.error is None and self.matched is not None:
            return self.matched >= (self.matched_min or 1.0)
        return self.error is None and self.rel_err is not None and self.rel_err <= (self.tolerance or 0.0)

    @property
    def outcome(self) -> str:
        """ "failed", or "1.53 ms, 100.0% matched, ok": how the row came out, in a few words."""
        if self.error is not None:
            return "failed"
        if self.median_ms is None:
            return "not timed"
        return f"{self.median_ms:.3g} ms, {self.check or 'not checked'}, {'ok' if self.ok else 'over tolerance'}"

    @property
    def check(self) -> str:
        """What the output was judged by: "97% matched" for detections, else the relative error; "" if neither."""
        if self.matched is not None:
            return f"{self.matched:.1%} matched"
        if self.rel_err is None:
            return ""
        mark = "fallback_random" if self.rng == "seeded, fallback_random" else "seeded"
        return f"{self.rel_err:.1e}" + (f" ({mark})" if self.rng else "")


@dataclass(frozen=True)
class Recommendation:
    config: str  # ConfigResult.name
    speedup: float | None  # over `baseline`
    code: str  # the exact code to use
    baseline: str | None = None  # the configuration the speed-up is over: eager fp32, else the table's eager row
    tie: list[str] = field(default_factory=list)  # other rows within 3% or within noise of the fastest
    reason: str = ""  # one line: why this row (fastest; or simplest of a tie)

    @property
    def versus(self) -> str:
        """ "5.23x eager fp32", or "" when the table has no eager row to compare with, or it is that row."""
        if not self.speedup or not self.baseline or self.baseline == self.config:
            return ""
        return f"{self.speedup:.2f}x {self.baseline}"


@dataclass(frozen=True)
class FixOffer:
    """One of our fixes (diagnose.fixes) for something in this report, with the code that applies it."""

    name: str  # the --with / with_= name
    what: str  # what applying it does
    code: str
    reasons: list[str] = field(default_factory=list)  # what it is offered for here: break places, failed rows


@dataclass(frozen=True)
class FixCapture:
    """Graph breaks read again with the report's `applied` fixes on, in one dtype, as the report's own are read."""

    dtype: str
    graph_count: int = 0
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    error: str | None = None  # Dynamo failed on the model with the fixes on

    @property
    def break_summary(self) -> str:
        return break_summary(self.graph_count, self.graph_breaks)


@dataclass(frozen=True)
class ChecklistItem:
    item: str
    status: str  # "pass", "fail" or "not-measured"
    evidence: str


@dataclass(frozen=True)
class ReportData:
    """Every field of a report and its JSON round trip; `fullgraph.diagnose.report.Report` adds HTML."""

    target: str
    device: str
    inputs: list[str]  # input specs, "4x3x224x224:float32"
    environment: dict[str, Any]
    lint: list[Finding] = field(default_factory=list)
    graph_count: int = 0
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    cudagraph_skips: list[str] = field(default_factory=list)
    configs: list[ConfigResult] = field(default_factory=list)
    recommendation: Recommendation | None = None
    checklist: list[ChecklistItem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    breakdowns: list[Breakdown] = field(default_factory=list)  # eager and the recommended row, profiled
    output: list[str] = field(default_factory=list)  # one line per kind of output the model or libraries printed
    timing: dict[str, Any] = field(default_factory=dict)  # how rows were timed: threads, rounds, method
    fixes: list[FixOffer] = field(default_factory=list)  # our fixes for the breaks and failures above
    applied: list[str] = field(default_factory=list)  # the fixes rows "... with NAME" ran with (with_=, --with)
    applied_breaks: list[FixCapture] = field(default_factory=list)  # breaks read with `applied` on, per dtype
    schema_version: int = SCHEMA_VERSION

    @property
    def nothing_checked(self) -> bool:
        """Rows ran but none had an output to check (a forward returning nothing, with no buffers to read)."""
        ran = [c for c in self.configs if c.error is None]
        return bool(ran) and all(c.rel_err is None and c.matched is None for c in ran)

    @property
    def breaks(self) -> list[GraphBreak]:
        """The places where a graph broke and compiling went on; skipped frames are not among them."""
        return [g for g in self.graph_breaks if not g.skipped]

    @property
    def skipped_frames(self) -> list[GraphBreak]:
        """The places where Dynamo gave up on a whole function and ran it eagerly, with why."""
        return [g for g in self.graph_breaks if g.skipped]

    @property
    def graph_break_count(self) -> int:
        """The one count of breaks every surface states: torch._dynamo.explain's (graphs captured, less one) where
        that is sane; with no graph captured (explain says -1), the breaks recorded outside skipped frames."""
        return break_count(self.graph_count, self.graph_breaks)

    @property
    def break_summary(self) -> str:
        """ "8 graph breaks at 2 places": the count, then the places in the code."""
        return break_summary(self.graph_count, self.graph_breaks)

    @property
    def fix_pairs(self) -> list[tuple[ConfigResult, ConfigResult]]:
        """(row as written, the same row run with the `applied` fixes), for every row run both ways."""

        def key(c: ConfigResult) -> tuple:
            return c.mode, c.dtype, tuple(c.ops.items()), c.rewrites_off

        plain = {key(c): c for c in self.configs if not c.fixes}
        return [(plain[key(c)], c) for c in self.configs if c.fixes and key(c) in plain]

    def to_dict(self) -> dict[str, Any]:
        d = _json_safe(dataclasses.asdict(self))
        d["graph_break_count"], d["graph_break_places"] = self.graph_break_count, len(self.breaks)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        d = dict(d)
        for derived in ("graph_break_count", "graph_break_places"):  # written for readers, computed again here
            d.pop(derived, None)
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"report schema {d.get('schema_version')} is not {SCHEMA_VERSION}; re-run the doctor")
        d["lint"] = [Finding(**f) for f in d.get("lint", [])]
        d["graph_breaks"] = [GraphBreak(**g) for g in d.get("graph_breaks", [])]
        d["recompiles"] = [Recompile(**r) for r in d.get("recompiles", [])]
        d["configs"] = [ConfigResult(**_floats_back(c, CONFIG_FLOATS)) for c in d.get("configs", [])]
        d["checklist"] = [ChecklistItem(**c) for c in d.get("checklist", [])]
        d["breakdowns"] = [Breakdown.from_dict(b) for b in d.get("breakdowns", [])]
        d["fixes"] = [FixOffer(**f) for f in d.get("fixes", [])]
        d["applied_breaks"] = [
            FixCapture(**{**c, "graph_breaks": [GraphBreak(**g) for g in c["graph_breaks"]]})
            for c in d.get("applied_breaks", [])
        ]
        if d.get("recommendation") is not None:
            d["recommendation"] = Recommendation(**d["recommendation"])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))

    def save_json(self, path: str | os.PathLike) -> None:
        write_atomic(path, self.to_json())


CONFIG_FLOATS = frozenset(f.name for f in dataclasses.fields(ConfigResult) if f.type.startswith("float"))


def _json_safe(value: Any) -> Any:
    """`value` (dicts and lists of plain data) with each non-finite float written as its NON_FINITE string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _floats_back(d: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """`d` with the NON_FINITE strings of its float fields `names` read back as floats."""
    return {k: NON_FINITE[v] if k in names and isinstance(v, str) and v in NON_FINITE else v for k, v in d.items()}
