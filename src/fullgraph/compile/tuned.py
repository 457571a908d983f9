"""A tune result: the configuration `fullgraph tune` measured fastest within tolerance, as data with a JSON
round-trip (DESIGN.md: this layer holds it so that `diagnose` writes it and `deploy` applies it without either
importing the other).

What each layer does with it:

- `fullgraph.compile(model, preset="auto", choice=result)` (or `choice="tuned.json"`) takes its compile settings:
  the preset or mode and the dtype (this layer cannot apply op policies: it never imports `ops`);
- `fullgraph.deploy.compile_tuned(model, result)` takes those and its op policies (`ops`), applied around this
  model's calls only;
- `fullgraph export TARGET --tuned tuned.json` takes its dtype, op policies and the preset's Inductor options.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fullgraph._files import write_atomic
from fullgraph.errors import UsageError

FORMAT = "fullgraph-tune/1"


@dataclass(frozen=True)
class TuneResult:
    """The pick and the table it was picked from. `config` names a row as the doctor does ("eager fp32",
    "compile perception bf16"); `ops` holds the op policies of that row (`{}` is every op's default, auto), in
    `fullgraph.ops.policy`'s vocabulary: {"all": "native"}, {"attention": "kernel"}."""

    config: str
    ops: Mapping[str, str] = field(default_factory=dict)
    speedup: float | None = None  # over `baseline`
    baseline: str | None = None
    reason: str = ""  # why this row: the fastest, or the simplest of a tie
    tie: tuple[str, ...] = ()
    table: tuple[Mapping[str, Any], ...] = ()  # every row measured: name, ms, p20/p80, compile s, error, ...
    skipped: tuple[str, ...] = ()  # rows left out under the budget, with their estimated cost
    notes: tuple[str, ...] = ()
    target: str = ""
    device: str = ""
    inputs: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)  # torch, triton, fullgraph, python versions
    budget_s: float | None = None
    elapsed_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, str) or not self.config.split():
            raise UsageError(f"a tune result needs its configuration's name, got {self.config!r}")
        bad = {k: v for k, v in dict(self.ops).items() if v not in ("native", "kernel", "auto")}
        if bad:
            raise UsageError(f"tune result: op policies {bad} are not 'native', 'kernel' or 'auto'")

    @property
    def name(self) -> str:
        """The row's full name: its configuration and, where set, its op policies ("compile dev bf16 ops=native")."""
        return self.config + (f" ops={ops_text(self.ops)}" if self.ops else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ops"], d["environment"] = dict(self.ops), dict(self.environment)
        d["table"] = [dict(row) for row in self.table]
        for k in ("tie", "skipped", "notes", "inputs"):
            d[k] = list(d[k])
        return {"format": FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "tune result") -> TuneResult:
        d = dict(d)
        fmt = d.pop("format", None)
        if fmt != FORMAT:
            raise UsageError(f"{source} is not a fullgraph tune result (format {fmt!r}, expected {FORMAT!r}); "
                             "write one with `fullgraph tune TARGET -o tuned.json`")  # fmt: skip
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"{source}: unknown fields {unknown}; was it written by a newer fullgraph?")
        for k in ("tie", "skipped", "notes", "inputs", "table"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def save(self, path: str | os.PathLike) -> str:
        """Write the JSON file (whole or not at all); returns its path."""
        write_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return os.fspath(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TuneResult:
        path = os.fspath(path)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise UsageError(f"{path} does not exist; write it with `fullgraph tune TARGET -o {path}`") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{path} is not a JSON tune result ({e}); write it again with `fullgraph tune`") from None
        if not isinstance(data, dict):
            raise UsageError(f"{path} holds a JSON {type(data).__name__}, not a tune result")
        return cls.from_dict(data, path)


def ops_text(ops: Mapping[str, str]) -> str:
    """{"all": "native"} -> "native"; {"attention": "kernel", "rope": "native"} -> "attention=kernel,rope=native"."""
    if set(ops) == {"all"}:
        return ops["all"]
    return ",".join(f"{k}={v}" for k, v in sorted(ops.items()))


def as_tune_result(choice: Any) -> TuneResult | None:
    """`choice` as a TuneResult when it is one, a dict in its JSON form, or a path to its JSON file; else None."""
    if isinstance(choice, TuneResult):
        return choice
    if isinstance(choice, Mapping) and choice.get("format") == FORMAT:
        return TuneResult.from_dict(choice)
    if isinstance(choice, os.PathLike) or (isinstance(choice, str) and choice.endswith(".json")):
        return TuneResult.load(choice)
    return None
