"""Compiles ahead of a timed run: child processes that run the same measurement once with nothing kept, several at
a time, so that the timed run finds its graphs in Inductor's FX-graph and AOTAutograd caches on this machine's disk
instead of compiling them (suites `sweep` and `zoo`, `--prewarm JOBS`). The compiles use the host's cores and run
side by side, where timings cannot run at all; the timed run then runs alone, as before.

What a prewarm child must not keep: the launch configurations Inductor's autotuner picks by timing its kernels at
their first call. Timed in eight processes sharing one GPU, the pick is noise, and Inductor's local autotune cache
would hand it to the timed run, a different one for each compiled variant (the sweep's "ours native" and "plain"
compile to the same kernels and measured 0.94x apart at one point, 1.05x at the next run, H100 2026-12-06). A child
(PREWARM_ENV set) therefore compiles with the local autotune cache off (`no_kept_autotuning`); the flag is not part of
the FX-graph cache key, so the timed run loads the prewarmed graph and tunes its kernels alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from fullgraph.errors import UsageError

PREWARM_ENV = "FULLGRAPH_PREWARM_CHILD"  # set in each prewarm child's environment


def no_kept_autotuning() -> None:
    """In a prewarm child (PREWARM_ENV set): Inductor keeps no autotuning choice of this process (module docstring);
    elsewhere nothing."""
    if os.environ.get(PREWARM_ENV) == "1":
        import torch._inductor.config as inductor_config

        inductor_config.autotune_local_cache = False


def run_children(children: Sequence[tuple[str, list[str]]], jobs: int, option: str = "--prewarm") -> None:
    """Each (label, argv) as a child process, `jobs` at a time, each given a share of Inductor's compile workers
    (TORCHINDUCTOR_COMPILE_THREADS); one progress line per child as it ends, with its last line of output and exit
    status when it failed (its compiles then happen in the timed run, as without a prewarm)."""
    if jobs < 1:
        raise UsageError(f"{option} {jobs}: give how many processes compile at once, e.g. 8 (0: no prewarm)")
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=threads, **{PREWARM_ENV: "1"})
    start, pending, running = time.monotonic(), list(children), []
    with tempfile.TemporaryDirectory(prefix="fullgraph-prewarm-") as tmp:
        while pending or running:
            while pending and len(running) < jobs:
                label, argv = pending.pop(0)
                log = open(os.path.join(tmp, f"{len(pending)}.log"), "w+b")  # noqa: SIM115 (closed as it ends)
                running.append((label, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log))
            time.sleep(0.2)
            for item in [r for r in running if r[1].poll() is not None]:
                label, child, log = item
                running.remove(item)
                say = f"[{time.monotonic() - start:7.1f}s] prewarm {len(children) - len(pending) - len(running)}"
                say += f"/{len(children)}: {label}"
                if child.returncode != 0:
                    log.seek(0)
                    last = (log.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
                    say += f" failed (exit {child.returncode}: {last[:200]}); its timed run compiles it"
                log.close()
                print(say, file=sys.stderr, flush=True)
