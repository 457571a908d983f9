"""Benchmark results as long-format rows: one measured value per row, tagged with where and when it ran.

Rows from different runs can be concatenated and compared; the tags (GPU, torch, triton, fullgraph
version, git commit, date) say which numbers may be compared with which.
"""

from __future__ import annotations

import csv
import datetime
import functools
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import torch

from fullgraph import env
from fullgraph._version import __version__
from fullgraph.errors import UsageError
from fullgraph.timing import Measurement, Timing


@dataclass(frozen=True)
class Result:
    suite: str  # "ceilings", "ops", ...
    case: str  # what was measured: "rms_norm 16384x4096 bf16"
    variant: str  # how: "eager", "compiled", "kernel"
    metric: str  # "median_ms", "tbps", ...
    value: float
    unit: str
    params: str  # JSON object of the case's parameters, keys sorted
    device: str
    gpu: str
    torch: str
    triton: str
    fullgraph: str
    commit: str
    date: str  # ISO 8601, UTC, seconds


COLUMNS = tuple(f.name for f in fields(Result))


@functools.cache
def _static_tags() -> tuple[tuple[str, str], ...]:
    cuda = torch.cuda.is_available()
    return (
        ("device", "cuda" if cuda else "cpu"),
        ("gpu", torch.cuda.get_device_name(0) if cuda else "cpu"),
        ("torch", torch.__version__),
        ("triton", env.triton_version() or ""),
        ("fullgraph", __version__),
        ("commit", env.git_commit() or ""),
    )


def tags() -> dict[str, str]:
    """The environment columns of every row written now."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return {**dict(_static_tags()), "date": now}


def make_rows(
    suite: str, case: str, variant: str, metrics: Mapping[str, tuple[float, str]], params: Mapping | None = None
) -> list[Result]:
    """One row per metric (`{"median_ms": (0.12, "ms")}`), all sharing the case, variant and tags."""
    t = tags()
    p = json.dumps(dict(params or {}), sort_keys=True, separators=(",", ":"))
    return [
        Result(suite=suite, case=case, variant=variant, metric=m, value=float(v), unit=u, params=p, **t)
        for m, (v, u) in metrics.items()
    ]


def timing_metrics(t: Timing) -> dict[str, tuple[float, str]]:
    return {
        "median_ms": (t.median_ms, "ms"),
        "p20_ms": (t.p20_ms, "ms"),
        "p80_ms": (t.p80_ms, "ms"),
    }


def measurement_metrics(m: Measurement) -> dict[str, tuple[float, str]]:
    out = {"first_call_s": (m.first_call_s, "s"), **timing_metrics(m.timing)}
    if m.peak_memory_bytes is not None:
        out["peak_memory_bytes"] = (float(m.peak_memory_bytes), "B")
    return out


def append_csv(path: str | os.PathLike, rows: Iterable[Result]) -> int:
    """Append rows to a CSV (header written when the file is new); returns how many were written. No rows: no file
    made (`bench sweep --from-csv` measures nothing)."""
    rows = list(rows)
    if not rows:
        return 0
    path = os.fspath(path)
    exists = os.path.exists(path) and os.path.getsize(path) > 0
    if exists:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if tuple(header) != COLUMNS:
            raise UsageError(f"{path} has other columns than a fullgraph results file; write to a new file")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if not exists:
            w.writerow(COLUMNS)
        for r in rows:
            w.writerow([repr(r.value) if c == "value" else getattr(r, c) for c in COLUMNS])
    return len(rows)


def read_csv(path: str | os.PathLike) -> list[Result]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise UsageError(f"{os.fspath(path)} is not a fullgraph results file (columns {reader.fieldnames})")
        return [Result(**{**row, "value": float(row["value"])}) for row in reader]
