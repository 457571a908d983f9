"""Suite `fleet`: N replica processes against one Redis, each with its own empty local cache folder, as on separate
machines (issue 35, item 4).

Each replica is the coldstart suite's child (`fullgraph.deploy.coldstart compile`, started as a program: this layer
imports no deploy code, DESIGN.md, Layers) with `fullgraph.deploy.remote.remote_cache()` turned on from
FULLGRAPH_REMOTE_CACHE / _KEY first; after its own JSON line it prints the remote cache's counters as
`{"remote": ...}`. Its imports come first and are timed apart, as coldstart's (`prepare(action)`: fullgraph's compiler
and Inductor's, for every variant alike), so the window holds what a replica does for its first request;
`window_imports` counts the modules still first imported inside it.
Variants, each in its own Redis database:
- `cold`: replicas one after another without the remote cache: the baseline (the median of their first outputs);
- `sequential`: through the remote caches, one after another: the first compiles and fills the cache, and every
  later replica must have zero remote FX-graph misses (a failure otherwise);
- `together`: through the remote caches, all at once: the first replica to miss an entry claims it and compiles, and
  the others wait for its entry (`remote_cache(wait=...)`), so a replica misses only what it claimed (a failure
  otherwise);
- `published`: one process publishes the precompiled code (`fullgraph.deploy.publish`, what `fullgraph cache warm`
  does), then replicas one after another start from it (`fullgraph.deploy.serve`): no trace, no compile; a replica
  that falls back to compiling is a failure.
Redis is a private redis-server started by the command line (`Sources.redis_server`), or --remote URL. Per replica:
time to first output (from the model on the device to its first output, Redis fetches included: coldstart's
`first_output_s`) and its ratio to the cold median, steady-state time (STEADY_ROUNDS) and its ratio to the cold
replicas', torch's FX-graph and AOTAutograd hits and misses, the remote cache's hits, misses, refusals and writes,
and compile time saved (on the CPU, Inductor's C++ kernels are not in the remote entry: a replica still compiles
them).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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
    _why,
    child_env,
    plan_from,
    rel_err,
    write_inputs,
)
from fullgraph.bench.table import format_table
from fullgraph.errors import UsageError

VARIANTS = ("cold", "sequential", "together", "published")
# The coldstart child, with the remote cache on first where the environment names one; its counters as a second line.
BOOT = (
    "import json, os, sys, time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
    "import fullgraph.deploy.coldstart as c, fullgraph.deploy.remote as r; c.prepare(sys.argv[1]); "
    "t2 = time.perf_counter(); fleet = r.remote_cache() if os.environ.get(r.ENV_URL) else None; "
    "sys.exit(c.main(sys.argv[1:], clock=(t0, t1, t2), "
    "after=lambda: print(json.dumps({'remote': fleet.stats() if fleet else {}}), flush=True)))"
)
# Steady state: every replica stays alive after its first output (coldstart's --hold), and once all have started,
# each times STEADY_ROUNDS rounds of --reps calls in turn, the order rotated every round. A replica's steady time is
# the median of its rounds: the cold replicas' and the others' interleaved over the same minutes, so that a drift of
# the machine (the first processes of a fresh machine ran 3-7% slower on the H100) does not read as a difference.
STEADY_ROUNDS = 5
# After the rounds, each held replica runs PROFILE_CALLS calls under torch's profiler: its kernels' time per call, so
# that two replicas whose steady times differ show where (the same kernels slower, or other kernels).
PROFILE_CALLS = 20


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


class _Replica:
    """A replica process and its stdout, read line by line by a thread (its stderr goes to a file)."""

    def __init__(self, name: str, proc: subprocess.Popen, work: str):
        self.name, self.proc, self.work, self.start = name, proc, work, time.perf_counter()
        self.err_path = os.path.join(work, f"{name}.err")
        self.stdout: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"fleet-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def message(self, wanted: Callable[[dict[str, Any]], bool], deadline: float) -> dict[str, Any] | None:
        """The next JSON line that `wanted` accepts, or None at the end of stdout or past `deadline`."""
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.perf_counter(), 0.0))
            except queue.Empty:
                return None
            if line is None:
                self._lines.put(None)  # the end stays the end for the next reader
                return None
            if line.startswith("{"):
                try:
                    found = json.loads(line)
                except ValueError:
                    continue
                if isinstance(found, dict) and wanted(found):
                    return found

    def ask(self, request: str) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):  # it died: the caller reports how
            return False

    def end(self, timeout: float) -> tuple[str, str]:
        """Ask it to exit (a held replica), wait, stop it past `timeout` (its whole process group); its stdout and
        stderr."""
        self.ask("exit")
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=10)
        with open(self.err_path, encoding="utf-8", errors="replace") as err:
            return "".join(self.stdout), err.read()


def _start(name: str, plan: Plan, work: str, url: str | None, key: str, action: str = "compile",
           hold: bool = False) -> _Replica:  # fmt: skip
    """A fresh replica process running coldstart's `action`, with its own empty local caches; through the remote
    cache at `url` (signed with `key`), or without one for None. With `hold`, it stays alive after its first output
    for the steady-state rounds."""
    argv = [sys.executable, "-c", BOOT, action, "--build", plan.spec.build, "--build-kwargs",
            json.dumps(plan.build_kwargs), "--inputs", os.path.join(work, "inputs.pt"), "--device", plan.device,
            "--dtype", plan.dtype, "--preset", plan.preset, "--reps", str(plan.reps),
            "--out", os.path.join(work, f"{name}.out.pt"), *(["--hold"] if hold else [])]  # fmt: skip
    env = child_env(work, f"inductor-{name}")
    if url is not None:
        env.update(FULLGRAPH_REMOTE_CACHE=url, FULLGRAPH_REMOTE_CACHE_KEY=key)
    env["FULLGRAPH_CACHE_DIR"] = os.path.join(work, f"fullgraph-{name}")
    with open(os.path.join(work, f"{name}.err"), "w", encoding="utf-8") as err:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True)  # fmt: skip
    return _Replica(name, proc, work)


def _result(rep: _Replica, child: dict[str, Any], remote: dict[str, Any]) -> dict[str, Any]:
    import torch

    ok = bool(child.get("ok"))
    out = os.path.join(rep.work, f"{rep.name}.out.pt")
    output = torch.load(out, weights_only=True) if ok and os.path.exists(out) else None
    return {"name": rep.name, "ok": ok, "error": None, "process_s": time.perf_counter() - rep.start,
            "child": child, "remote": remote, "output": output, "rounds_ms": []}  # fmt: skip


def _close(r: dict[str, Any], timeout: float, failed: str | None = None) -> None:
    """End a replica's process and write its log; a failure (`failed`, a report that says so, or an exit status
    other than 0) becomes the result's error, with the exit status and the line of stderr that says most."""
    rep: _Replica = r.pop("rep")
    stdout, stderr = rep.end(timeout)
    with open(os.path.join(rep.work, f"{rep.name}.log"), "w", encoding="utf-8") as log:
        log.write(f"--- stdout\n{stdout}\n--- stderr\n{stderr}")
    r["remote"] = r["remote"] or _remote_line(stdout)
    why = failed or r["child"].get("error") or _why(stderr)
    if failed or not r["ok"] or rep.proc.returncode != 0:
        r["ok"], r["error"] = False, f"{_exit_text(rep.proc.returncode)}: {why}"


def _finish(rep: _Replica, timeout: float) -> dict[str, Any]:
    """The replica's report once it printed it; one that holds stays alive (`rep`), any other is ended."""
    deadline = time.perf_counter() + timeout
    child = rep.message(lambda d: "action" in d, deadline) or {}
    remote = (rep.message(lambda d: "remote" in d, deadline) or {}).get("remote", {}) if child else {}
    r = _result(rep, child, remote)
    r["rep"] = rep
    if r["ok"] and child.get("holding"):
        return r
    late = not child and time.perf_counter() >= deadline  # no report by the deadline (not its stdout's end): stopped
    _close(r, max(deadline - time.perf_counter(), 1.0), f"no report within {timeout:g} s" if late else None)
    return r


def _held(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The replicas still alive (held after their first output), in the order they started."""
    return [r for done in runs.values() for r in done if r.get("rep")]


def steady_rounds(runs: dict[str, list[dict[str, Any]]], rounds: int, reps: int, timeout: float, say) -> None:
    """Each held replica times `rounds` rounds of `reps` calls, one replica at a time, the order rotated each
    round (`rounds_ms`, whose median is its steady time: `_steady`). A replica that stops answering is a failure."""
    held = _held(runs)
    if not held:
        return
    say(f"steady state: {rounds} rounds of {reps} calls, the {len(held)} replicas in turn")
    for k in range(rounds):
        for r in held[k % len(held) :] + held[: k % len(held)]:
            rep = r.get("rep")
            if rep is None:  # it failed in an earlier round
                continue
            asked = rep.ask(f"time {reps}")
            answer = rep.message(lambda d: "round_ms" in d, time.perf_counter() + timeout) if asked else None
            if answer is None:
                _close(r, timeout, failed=f"stopped answering in steady round {k + 1}")
            else:
                r["rounds_ms"].append(answer["round_ms"])


def profile_replicas(runs: dict[str, list[dict[str, Any]]], calls: int, timeout: float, say) -> None:
    """Each held replica's kernels over `calls` calls under torch's profiler (`profile_us`: microseconds per call by
    kernel), one replica at a time: what two replicas that time apart run differently. A replica that does not
    answer keeps no profile (the steady rounds already judged it)."""
    held = _held(runs)
    if not held or calls < 1:
        return
    say(f"profiles: {calls} calls of each of the {len(held)} replicas under torch's profiler")
    for r in held:
        rep = r["rep"]
        answer = rep.message(lambda d: "profile_us" in d or "error" in d, time.perf_counter() + timeout) \
            if rep.ask(f"profile {calls}") else None  # fmt: skip
        if answer is not None and isinstance(answer.get("profile_us"), dict):
            r["profile_us"] = answer["profile_us"]


def profile_differences(runs: dict[str, list[dict[str, Any]]], top: int = 8) -> list[str]:
    """Lines naming the kernels whose time per call differs most between the fastest and the slowest profiled
    replica (by steady time): empty with fewer than two."""
    done = [r for rs in runs.values() for r in rs if r.get("profile_us") and _steady(r) is not None]
    if len(done) < 2:
        return []
    fast, slow = min(done, key=_steady), max(done, key=_steady)
    a, b = fast["profile_us"], slow["profile_us"]
    total = f"{sum(a.values()):.1f} / {sum(b.values()):.1f} us per call in its top kernels"
    lines = [f"kernels, fastest {fast['name']} ({_steady(fast):.4g} ms) against slowest {slow['name']} "
             f"({_steady(slow):.4g} ms): {total}"]  # fmt: skip
    for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0.0) - a.get(k, 0.0)))[:top]:
        lines.append(f"  {k[:70]:70s} {a.get(k, 0.0):9.2f} {b.get(k, 0.0):9.2f} us")
    return lines


def summary(r: dict[str, Any]) -> str:
    """One replica's figures in a line, said as it finishes: a run cut short (a device call's time limit) keeps them."""
    if not r["ok"]:
        return f"{r['name']}: {r['error']}"
    c, remote = r["child"], r["remote"]
    counters = c.get("counters") or {}
    figures = [f"{k} {c[k]:.3f}" for k in ("first_output_s", "median_ms", "publish_s") if c.get(k) is not None]
    if c.get("window_imports") is not None:
        figures.append(f"{c['window_imports']} modules imported in the window")
    figures.append(f"FX hit/miss {counters.get('fxgraph_cache_hit', 0)}/{counters.get('fxgraph_cache_miss', 0)}")
    if remote:
        figures.append(
            f"remote hit/miss/refused {remote.get('hit', 0)}/{remote.get('miss', 0)}/{remote.get('refused', 0)}"
            + (f", waited {remote.get('waited_s', 0):.1f} s for another's compile" if remote.get("waited") else "")
        )
    return f"{r['name']}: " + ", ".join(figures) + (f" ({c['how']})" if c.get("how") else "")


def run_variant(variant: str, plan: Plan, work: str, url: str, key: str, n: int, say, done: list[dict[str, Any]],
                hold: bool = False) -> None:  # fmt: skip
    """The replicas of one variant (the published variant's publisher first, as replica 0), appended to `done` as
    each finishes (so that a caller can end the held ones if this stops), each said in a line. With `hold`, every
    replica that ran stays alive for the steady-state rounds."""
    names = [f"{variant}-{i + 1}" for i in range(n)]

    def finish(started: _Replica) -> dict[str, Any]:
        done.append(_finish(started, plan.timeout))
        say(summary(done[-1]))
        return done[-1]

    if variant == "together":
        say(f"{variant}: {n} fresh processes at once")
        for started in [_start(name, plan, work, url, key, hold=hold) for name in names]:
            finish(started)
        return
    if variant == "published":
        say(f"{variant}-0: publishing the precompiled code (fullgraph.deploy.publish)")
        if not finish(_start(f"{variant}-0", plan, work, url, key, action="publish"))["ok"]:
            return
    action = {"published": "serve"}.get(variant, "compile")
    for name in names:
        say(f"{name}: a fresh process with an empty local cache" + (", no remote cache" if variant == "cold" else ""))
        finish(_start(name, plan, work, None if variant == "cold" else url, key, action, hold=hold))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _steady(r: dict[str, Any]) -> float | None:
    """A replica's steady time: the median of its interleaved rounds, or what it timed alone before it exited."""
    rounds = r.get("rounds_ms")
    return statistics.median(rounds) if rounds else r["child"].get("median_ms")


def _baseline(runs: dict[str, list[dict[str, Any]]], value: Callable[[dict[str, Any]], Any]) -> float | None:
    """The cold replicas' median of `value`; without a cold variant, the first sequential replica's (it compiled)."""
    cold = runs.get("cold") or runs.get("sequential", [])[:1]
    return _median([v for v in (value(r) for r in cold if r["ok"]) if v is not None])


def report(plan: Plan, runs: dict[str, list[dict[str, Any]]], expected) -> tuple[list[Result], str, str | None]:
    rows: list[Result] = []
    table, failures = [], []
    cold_first, cold_steady = _baseline(runs, lambda r: r["child"].get("first_output_s")), _baseline(runs, _steady)
    for variant, done in runs.items():
        for i, r in enumerate(done):
            c, remote = r["child"], r["remote"]
            publisher = c.get("action") == "publish"
            counters = c.get("counters") or {}
            first, steady = c.get("first_output_s"), _steady(r)
            replica = not publisher and variant != "cold"
            ratio = first / cold_first if replica and first is not None and cold_first else None
            steady_ratio = steady / cold_steady if replica and steady is not None and cold_steady else None
            saved = cold_first - first if ratio is not None else None
            err = rel_err(r["output"], expected)
            metrics: dict[str, tuple[float, str]] = {"ok": (float(r["ok"]), ""), "process_s": (r["process_s"], "s")}
            for k in ("first_output_s", "first_call_s", "import_torch_s", "import_fullgraph_s", "median_ms",
                      "publish_s", "window_imports"):  # fmt: skip
                if c.get(k) is not None:
                    metrics[k] = (c[k], "ms" if k.endswith("_ms") else "" if k == "window_imports" else "s")
            metrics.update({k: (float(v), "") for k, v in counters.items()})
            metrics.update({f"remote_{k}": (float(remote[k]), "s" if k.endswith("_s") else "")
                            for k in ("hit", "miss", "refused", "put", "claimed", "waited", "waited_s")
                            if k in remote})  # fmt: skip
            rounds = r.get("rounds_ms") or []
            if rounds:
                metrics.update(steady_ms=(steady, "ms"), steady_rounds=(float(len(rounds)), ""))
            profiled = r.get("profile_us") or {}
            if profiled:
                metrics["profiled_us_per_call"] = (sum(profiled.values()), "us")
            for k, v in (("compile_saved_s", saved), ("first_output_x_cold", ratio), ("steady_x_cold", steady_ratio),
                         ("rel_err", err)):  # fmt: skip
                if v is not None:
                    metrics[k] = (v, "s" if k.endswith("_s") else "")
            params = {"model": plan.model, "batch": plan.batch, "dtype": plan.dtype, "preset": plan.preset,
                      "replicas": len(done), **({"error": r["error"]} if r["error"] else {}),
                      **({"how": c["how"]} if c.get("how") else {}), **({"code": c["code"]} if c.get("code") else {}),
                      **({"pad": c["pad"]} if c.get("pad") else {}),
                      **({"rounds_ms": [round(x, 5) for x in rounds]} if rounds else {}),
                      **({"profile_us": profiled} if profiled else {})}  # fmt: skip
            rows += make_rows("fleet", plan.point, r["name"], metrics, params)
            by_cache = remote.get("by_cache", {})
            misses, claimed = by_cache.get("fx-graph-v1.miss", 0), by_cache.get("fx-graph-v1.claimed", 0)
            if not r["ok"]:
                failures.append(f"{r['name']}: {r['error']}")
            elif variant == "sequential" and i and misses:
                failures.append(f"{r['name']}: {misses} remote FX-graph misses")
            elif variant == "together" and misses > claimed:
                failures.append(f"{r['name']}: {misses} remote FX-graph misses, {claimed} of them claimed (it "
                                "compiled what another replica was compiling)")  # fmt: skip
            elif variant == "published" and not publisher and not str(c.get("how", "")).startswith("published"):
                failures.append(f"{r['name']}: not served from the published code ({c.get('how')})")
            status = "ok" if r["ok"] else f"failed: {r['error']}"
            if publisher and r["ok"]:
                status = f"published {c.get('file_bytes', 0) / 1e6:.1f} MB in {c.get('publish_s', 0):.1f} s"
            elif c.get("how"):
                status = c["how"]
            table.append([r["name"], first, ratio, steady, steady_ratio,
                          f"{counters.get('fxgraph_cache_hit', '-')}/{counters.get('fxgraph_cache_miss', '-')}",
                          f"{counters.get('autograd_cache_hit', '-')}/{counters.get('autograd_cache_miss', '-')}",
                          f"{remote.get('hit', '-')}/{remote.get('miss', '-')}/{remote.get('refused', '-')}",
                          remote.get("put"), remote.get("waited_s") if remote.get("waited") else None, err,
                          c.get("code") or "-", c.get("pad") or "-", status])  # fmt: skip
    headers = ["replica", "1st output s", "x cold", "steady ms", "x cold", "FX hit/miss", "AOT hit/miss",
               "remote hit/miss/refused", "remote puts", "waited s", "rel err vs fp32", "code", "pad",
               "status"]  # fmt: skip
    base = f"cold median {cold_first:.2f} s" if cold_first is not None else "no cold replica finished"
    rounds = max((len(r.get("rounds_ms") or []) for done in runs.values() for r in done), default=0)
    how = (f"steady: the median of {rounds} rounds of {plan.reps} calls, the replicas interleaved" if rounds
           else f"steady: {plan.reps} calls in each replica before it exited")  # fmt: skip
    about = f"{plan.point}: each replica a fresh process with an empty local cache, one Redis; {base}; {how}"
    text = [about, format_table(headers, table), *profile_differences(runs)]
    return rows, "\n".join(text), "; ".join(failures) or None


def run(args, sources: Sources) -> tuple[list[Result], str, str | None]:
    plan = plan_from(args)
    n = getattr(args, "replicas", None) or 4
    variants = tuple(v.strip() for v in (getattr(args, "variants", None) or ",".join(VARIANTS)).split(","))
    if n < 2 or any(v not in VARIANTS for v in variants):
        raise UsageError(f"--replicas at least 2, --variants from {', '.join(VARIANTS)}")
    rounds = getattr(args, "steady_rounds", None)
    rounds = STEADY_ROUNDS if rounds is None else rounds
    if rounds < 0:
        raise UsageError(f"--steady-rounds {rounds}: give 0 (each replica times itself before it exits) or more")
    profiles = getattr(args, "profile_calls", None)
    profiles = PROFILE_CALLS if profiles is None else profiles
    if profiles < 0 or (profiles and not rounds):
        why = "the replicas are held only for steady rounds" if profiles > 0 else "give 0 (none) or more"
        raise UsageError(f"--profile-calls {profiles}: {why}")
    key = secrets.token_hex(16)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="fullgraph-fleet-") as work:
        sources.progress(f"{plan.point}: eager fp32 reference in this process")
        expected = write_inputs(plan, work)
        remote = getattr(args, "remote", None)
        try:
            with sources.redis_server(work) if remote is None else _given(remote) as server:
                for db, v in enumerate(variants):
                    url = _url(server.url, server.password, db)
                    run_variant(v, plan, work, url, key, n, sources.progress, runs[v], hold=rounds > 0)
                steady_rounds(runs, rounds, plan.reps, plan.timeout, sources.progress)
                profile_replicas(runs, profiles, plan.timeout, sources.progress)
        finally:  # the held replicas end here, also when a variant failed or Ctrl-C stopped the run
            for r in _held(runs):
                _close(r, 30.0)
    return report(plan, runs, expected)


class _given(AbstractContextManager):
    """--remote URL: a Redis the user runs (databases 0 to 3 are used, one per variant)."""

    def __init__(self, url: str):
        self.url, self.password = url, None

    def __exit__(self, *exc: object) -> None:
        return None
