"""Suite `fleet`: N replica processes against one Redis, each with its own empty local cache folder, as on separate
machines (issue 35, item 4).

Each replica is the coldstart suite's child (`fullgraph.deploy.coldstart compile`, started as a program: this layer
imports no deploy code, DESIGN.md, Layers) with `fullgraph.deploy.remote.remote_cache()` turned on from
FULLGRAPH_REMOTE_CACHE / _KEY first; after its own JSON line it prints the remote cache's counters as
`{"remote": ...}`.
Variants: `sequential` (the first replica compiles and fills the cache, each next one starts after the last ended:
every later replica should have zero remote FX-graph misses, a failure otherwise) and `together` (all start at
once: reported, not held to zero misses). Each variant gets its own Redis database. Redis is a private
redis-server started by the command line (`Sources.redis_server`), or --remote URL. Per replica: time to first
output, torch's FX-graph and AOTAutograd hits and misses, the remote cache's hits, misses, refusals and writes, and
compile time saved against the first replica (on the CPU, Inductor's C++ kernels are not in the remote entry: a
replica still compiles them).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fullgraph.bench.results import Result, make_rows
from fullgraph.bench.suites.coldstart import (
    Plan,
    _exit_text,
    _json_line,
    _why,
    child_env,
    plan_from,
    rel_err,
    write_inputs,
)
from fullgraph.bench.table import format_table
from fullgraph.errors import UsageError

VARIANTS = ("sequential", "together")
# The coldstart child, with the remote cache on first; its counters as a second JSON line.
BOOT = (
    "import json, sys, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
    "import fullgraph.compile, fullgraph.deploy.coldstart as c, fullgraph.deploy.remote as r; "
    "t2 = time.perf_counter(); fleet = r.remote_cache(); rc = c.main(sys.argv[1:], clock=(t0, t1, t2)); "
    "print(json.dumps({'remote': fleet.stats()}), flush=True); sys.exit(rc)"
)


@dataclass(frozen=True)
class Sources:
    """What this suite needs from above the bench layer: a private Redis, `redis_server(folder)` -> a context
    yielding an object with `url` and `password` (fullgraph.deploy.remote_server), and progress lines."""

    redis_server: Callable[[str], AbstractContextManager[Any]]
    progress: Callable[[str], None]


def _url(url: str, password: str | None, db: int) -> str:
    """`url` with the password in it and database `db`."""
    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname or "localhost"
    password = password or parts.password
    return urlunsplit((parts.scheme, f":{password}@{host}" if password else host, f"/{db}", "", ""))


def _remote_line(stdout: str) -> dict[str, Any]:
    """The replica's remote cache counters, from its `{"remote": ...}` line."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith('{"remote": ')]
    return json.loads(lines[-1])["remote"] if lines else {}


def _start(name: str, plan: Plan, work: str, url: str, key: str) -> tuple[str, subprocess.Popen, float]:
    argv = [sys.executable, "-c", BOOT, "compile", "--build", plan.spec.build, "--build-kwargs",
            json.dumps(plan.build_kwargs), "--inputs", os.path.join(work, "inputs.pt"), "--device", plan.device,
            "--dtype", plan.dtype, "--preset", plan.preset, "--reps", str(plan.reps),
            "--out", os.path.join(work, f"{name}.out.pt")]  # fmt: skip
    env = {**child_env(work, f"inductor-{name}"), "FULLGRAPH_REMOTE_CACHE": url, "FULLGRAPH_REMOTE_CACHE_KEY": key}
    env["FULLGRAPH_CACHE_DIR"] = os.path.join(work, f"fullgraph-{name}")
    pipe = subprocess.PIPE
    proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, text=True,
                            start_new_session=True)  # fmt: skip
    return name, proc, time.perf_counter()


def _finish(started: tuple[str, subprocess.Popen, float], work: str, timeout: float) -> dict[str, Any]:
    import torch

    name, proc, start = started
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    with open(os.path.join(work, f"{name}.log"), "w", encoding="utf-8") as log:
        log.write(f"--- stdout\n{stdout}\n--- stderr\n{stderr}")
    child, remote = _json_line(stdout) or {}, _remote_line(stdout)
    ok = bool(child.get("ok")) and proc.returncode == 0
    error = None if ok else f"{_exit_text(proc.returncode)}: {child.get('error') or _why(stderr)}"
    out = os.path.join(work, f"{name}.out.pt")
    output = torch.load(out, weights_only=True) if ok and os.path.exists(out) else None
    return {"name": name, "ok": ok, "error": error, "process_s": time.perf_counter() - start, "child": child,
            "remote": remote, "output": output}  # fmt: skip


def run_variant(variant: str, plan: Plan, work: str, url: str, key: str, n: int, say) -> list[dict[str, Any]]:
    names = [f"{variant}-{i + 1}" for i in range(n)]
    if variant == "sequential":
        done = []
        for name in names:
            say(f"{name}: a fresh process with an empty local cache")
            done.append(_finish(_start(name, plan, work, url, key), work, plan.timeout))
        return done
    say(f"{variant}: {n} fresh processes at once")
    started = [_start(name, plan, work, url, key) for name in names]
    return [_finish(s, work, plan.timeout) for s in started]


def report(plan: Plan, runs: dict[str, list[dict[str, Any]]], expected) -> tuple[list[Result], str, str | None]:
    rows: list[Result] = []
    table, failures = [], []
    for variant, done in runs.items():
        cold = done[0]["child"].get("first_call_s")
        for i, r in enumerate(done):
            c, remote = r["child"], r["remote"]
            counters = c.get("counters") or {}
            first = c.get("first_call_s")
            saved = cold - first if cold is not None and first is not None and i else None
            err = rel_err(r["output"], expected)
            metrics: dict[str, tuple[float, str]] = {"ok": (float(r["ok"]), ""), "process_s": (r["process_s"], "s")}
            for k in ("first_output_s", "first_call_s", "import_torch_s", "import_fullgraph_s", "median_ms"):
                if c.get(k) is not None:
                    metrics[k] = (c[k], "ms" if k.endswith("_ms") else "s")
            metrics.update({k: (float(v), "") for k, v in counters.items()})
            metrics.update(
                {f"remote_{k}": (float(remote[k]), "") for k in ("hit", "miss", "refused", "put") if k in remote}
            )
            if saved is not None:
                metrics["compile_saved_s"] = (saved, "s")
            if err is not None:
                metrics["rel_err"] = (err, "")
            params = {"model": plan.model, "batch": plan.batch, "dtype": plan.dtype, "preset": plan.preset,
                      "replicas": len(done), **({"error": r["error"]} if r["error"] else {})}  # fmt: skip
            rows += make_rows("fleet", plan.point, r["name"], metrics, params)
            misses = remote.get("by_cache", {}).get("fx-graph-v1.miss", 0)
            if variant == "sequential" and i and (misses or not r["ok"]):
                failures.append(f"{r['name']}: {r['error'] or f'{misses} remote FX-graph misses'}")
            table.append([r["name"], c.get("first_output_s"), saved,
                          f"{counters.get('fxgraph_cache_hit', '-')}/{counters.get('fxgraph_cache_miss', '-')}",
                          f"{counters.get('autograd_cache_hit', '-')}/{counters.get('autograd_cache_miss', '-')}",
                          f"{remote.get('hit', '-')}/{remote.get('miss', '-')}/{remote.get('refused', '-')}",
                          remote.get("put"), err, "ok" if r["ok"] else f"failed: {r['error']}"])  # fmt: skip
    headers = ["replica", "1st output s", "compile saved s", "FX hit/miss", "AOT hit/miss",
               "remote hit/miss/refused", "remote puts", "rel err vs fp32", "status"]  # fmt: skip
    about = f"{plan.point}: each replica a fresh process with an empty local cache, one Redis"
    return rows, "\n".join([about, format_table(headers, table)]), "; ".join(failures) or None


def run(args, sources: Sources) -> tuple[list[Result], str, str | None]:
    plan = plan_from(args)
    n = getattr(args, "replicas", None) or 4
    variants = tuple(v.strip() for v in (getattr(args, "variants", None) or ",".join(VARIANTS)).split(","))
    if n < 2 or any(v not in VARIANTS for v in variants):
        raise UsageError(f"--replicas at least 2, --variants from {', '.join(VARIANTS)}")
    key = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="fullgraph-fleet-") as work:
        sources.progress(f"{plan.point}: eager fp32 reference in this process")
        expected = write_inputs(plan, work)
        remote = getattr(args, "remote", None)
        with sources.redis_server(work) if remote is None else _given(remote) as server:
            runs = {v: run_variant(v, plan, work, _url(server.url, server.password, db), key, n, sources.progress)
                    for db, v in enumerate(variants)}  # fmt: skip
    return report(plan, runs, expected)


class _given(AbstractContextManager):
    """--remote URL: a Redis the user runs (its databases 0 and 1 are used, one per variant)."""

    def __init__(self, url: str):
        self.url, self.password = url, None

    def __exit__(self, *exc: object) -> None:
        return None
