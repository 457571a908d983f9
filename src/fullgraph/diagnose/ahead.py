"""Compile the slow rows of a search ahead, in background processes, while this process builds the quick ones.

An autotuning mode compiles for minutes where the others take seconds: on the H200, `fullgraph tune` on timm's
ViT-B/16 (batch 4) compiled the edge preset in fp32 for 307 s, against 2-15 s for every other preset, so edge
fp32 and edge bf16 one after the other did not fit a 480 s budget
(benchmarks/results/fullgraph_tune_vit_serial_h200.txt).
`Ahead` starts one child process per slow row when the search starts. Each child compiles its row exactly as the
search does (`configs.build`, the same inputs, op policies and Inductor settings) and calls it once, which fills
the shared caches of the cache folder: Inductor's FX graphs, autotuning results, Triton kernels and C++ wrappers.
When the search reaches the row, it waits for that child and then builds the row itself from the warm caches, in
seconds (a frozen, cpp_wrapper graph hits the FX graph cache across processes with other weights: only the
weights' shapes are in its key). The row's compile seconds shown are the child's: what compiling it costs.

The model and inputs reach the children pickled (`torch.save`); a model that cannot be pickled (a class defined in
`__main__`, a lambda inside) is compiled in this process as before, said in a note. At most `workers` children run
at once; the rest wait their turn. Children still running when the search stops are killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fullgraph import env
from fullgraph.compile.choice import DTYPES
from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose.inputs import Example
from fullgraph.timing import first_call

SLOW_COST = 10.0  # a row whose mode costs this many default-mode compiles or more (configs.COST) is compiled ahead
WORKERS = 2  # children at once: each autotunes on the GPU and compiles on every core


def slow(c: cfg.Candidate) -> bool:
    """Whether a row is worth compiling ahead: an autotuning mode (max-autotune, or a preset that runs it)."""
    return cfg.COST.get(cfg.mode_of(c.mode), 1.0) >= SLOW_COST


@dataclass
class _Child:
    cand: cfg.Candidate
    proc: subprocess.Popen | None = None
    log: Path | None = None  # the child's stderr
    out: Path | None = None  # its stdout: the JSON report last
    report: dict[str, Any] = field(default_factory=dict)


class Ahead:
    """Background compiles of `cands` for `model` on `example` (see the module docstring). Use as a context
    manager: leaving it kills what still runs and removes the pickled model."""

    def __init__(self, model: torch.nn.Module, example: Example, cands: Sequence[cfg.Candidate], *,
                 workers: int = WORKERS, say: Callable[[str], None] = lambda msg: None) -> None:  # fmt: skip
        self.workers = max(1, workers)
        self.say = say
        self.children = {c.name: _Child(c) for c in cands}
        self.why_not: str | None = None  # set when nothing runs ahead, and why
        self._dir = Path(tempfile.mkdtemp(prefix="fullgraph-ahead-"))
        self._file = self._dir / "model.pt"
        if self.children and not caches_on():
            self.why_not = ("Inductor's caches are off here (TORCHINDUCTOR_FORCE_DISABLE_CACHES or fx_graph_cache), so "
                            "a background compile would leave nothing for this process to reuse")  # fmt: skip
            self.children = {}
        if self.children:
            try:
                torch.save({"model": model, "args": example.args, "kwargs": example.kwargs}, self._file)
            except Exception as e:  # pickling a local class, a lambda, an open file...
                self.why_not = f"the model could not be pickled for background compiles ({env.first_line(e, 160)})"
                self.children = {}

    def __enter__(self) -> Ahead:
        self._fill()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __contains__(self, c: cfg.Candidate) -> bool:
        return c.name in self.children

    def _fill(self) -> None:
        """Start queued children while fewer than `workers` run."""
        running = sum(1 for ch in self.children.values() if ch.proc is not None and ch.proc.poll() is None)
        for ch in self.children.values():
            if running >= self.workers:
                return
            if ch.proc is None and not ch.report:
                self._start(ch)
                running += 1

    def _start(self, ch: _Child) -> None:
        c = ch.cand
        n = sum(1 for child in self.children.values() if child.proc is not None)
        ch.log, ch.out = self._dir / f"{n}.log", self._dir / f"{n}.out"
        argv = [sys.executable, "-m", "fullgraph.diagnose.ahead", str(self._file), c.mode, cfg.short_dtype(c.dtype),
                json.dumps(dict(c.ops))]  # fmt: skip
        # Both streams to files, not pipes: a child that prints more than a pipe holds would block on it.
        with open(ch.out, "w") as out, open(ch.log, "w") as log:
            ch.proc = subprocess.Popen(argv, stdout=out, stderr=log, text=True, env=_child_env())
        self.say(f"compiling ahead in the background: {c.name}")

    def wait(self, c: cfg.Candidate, deadline: float) -> dict[str, Any]:
        """Wait (until `deadline`, a time.monotonic() value) for `c`'s child; its report: {"ok": True,
        "compile_s": ...}, {"ok": False, "error": ...}, or {"ok": False, "late": True} when the deadline came
        first (the child is killed)."""
        ch = self.children[c.name]
        while not ch.report:
            self._fill()
            if ch.proc is not None and ch.proc.poll() is not None:
                self._collect(ch)
                break
            if time.monotonic() >= deadline:
                self._kill(ch)
                ch.report = {"ok": False, "late": True}
                break
            self._reap_others()
            time.sleep(0.2)
        self._fill()
        return ch.report

    def _reap_others(self) -> None:
        for ch in self.children.values():
            if ch.proc is not None and not ch.report and ch.proc.poll() is not None:
                self._collect(ch)

    def _collect(self, ch: _Child) -> None:
        out = ch.out.read_text(errors="replace") if ch.out and ch.out.exists() else ""
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if lines:
            ch.report = json.loads(lines[-1])
        else:
            tail = ch.log.read_text(errors="replace").strip().splitlines()[-1:] if ch.log else []
            ch.report = {"ok": False, "error": f"the background compile exited {ch.proc.returncode}: "
                         f"{tail[0][:300] if tail else 'no output'}"}  # fmt: skip

    def _kill(self, ch: _Child) -> None:
        if ch.proc is not None and ch.proc.poll() is None:
            ch.proc.kill()
            ch.proc.wait()

    def close(self) -> None:
        for ch in self.children.values():
            self._kill(ch)
        if self._dir.exists():  # closed once; leaving the context closes again
            for p in self._dir.iterdir():
                p.unlink(missing_ok=True)
            self._dir.rmdir()


def caches_on() -> bool:
    """Whether a compile here can reuse what a child compiled: Inductor's FX graph cache is on and not disabled."""
    config = torch._inductor.config
    return bool(config.fx_graph_cache) and not config.force_disable_caches


def _child_env() -> dict[str, str]:
    """This process's environment (the same cache folders and settings, so the children fill the caches this
    process reads), with the package importable where it was imported from."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}


def main(argv: Sequence[str]) -> int:
    """The child: compile one row as the search does and call it once; print one JSON line."""
    file, mode, dtype_name, ops = argv
    dtype = DTYPES[dtype_name]
    c = cfg.Candidate(mode, dtype, tuple(sorted(json.loads(ops).items())))
    try:
        import fullgraph.ops  # noqa: F401 - registers the custom ops the model may call

        saved = torch.load(file, weights_only=False)
        example = Example.of(saved["args"], saved["kwargs"])
        fn = cfg.build(saved["model"].eval(), c.mode, c.dtype)
        x = example.cast(c.dtype)
        with torch.no_grad(), c.policies():
            c.compile_s, _ = first_call(lambda: x.call(fn), example.device)
        print(json.dumps({"ok": True, "compile_s": c.compile_s}), flush=True)
    except Exception as e:
        print(json.dumps({"ok": False, "error": env.first_line(e, 300)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
