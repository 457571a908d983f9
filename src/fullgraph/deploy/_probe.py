"""The probe: an AOTInductor package loaded once in a child process before this process loads it (a loader can crash
in native code), with its verdict remembered per file content, torch, fullgraph and device in `<fullgraph cache
dir>/aoti_probes.json` (`remember`: updated under a file lock, so processes loading packages at once keep each
other's verdicts). `fullgraph.deploy.package` checks a file, then asks `run_probe`."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from fullgraph._files import locked, write_atomic
from fullgraph._paths import display_path
from fullgraph.deploy._common import DeployError, cache_dir, environment

PROBE_FILE = "aoti_probes.json"
PROBE_TIMEOUT_S = 300.0

_PROBE_CODE = (
    "import importlib, sys; "
    # the modules that register the pytree types the package takes or returns (a transformers ModelOutput)
    "[importlib.import_module(m) for m in sys.argv[3].split(',') if m]; "
    # fullgraph.ops registers our custom ops, which the package calls when it lists any (and imports Dynamo: only then)
    "sys.argv[4:] and importlib.import_module('fullgraph.ops').register_ops(sys.argv[4:]); "
    "from fullgraph.deploy.package import open_package; open_package(sys.argv[1], int(sys.argv[2]))"
)


def probe_argv(path: str, device_index: int, ops: Sequence[str] = (), modules: Sequence[str] = ()) -> list[str]:
    """The child that loads the package, which calls `ops` through Python and whose inputs or outputs are pytree
    types that importing `modules` registers; faulthandler prints the native stack if it crashes."""
    return [sys.executable, "-X", "faulthandler", "-c", _PROBE_CODE, path, str(device_index), ",".join(modules), *ops]


def probe_env(scratch: str) -> dict[str, str]:
    """The probe child's environment: its temporary files in `scratch`, which the parent removes. torch's loader
    unpacks the package's libraries into a new `aotinductor_*` folder under TMPDIR and removes it only when the
    loader is destroyed: a probe that crashes (what it is there to catch) or times out would leave the package's
    size behind in /tmp at every try. Inductor's cache stays where this process's is (its default lies under
    TMPDIR too), so kernels the child compiles are kept."""
    default_cache = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", _user()))
    return {
        **os.environ,
        "TMPDIR": scratch,
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", default_cache),
    }


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):  # no name for this uid (a container's): as torch falls back
        return f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"


def probe_key(sha: str, device_index: int) -> str:
    here = environment()
    return "|".join(map(str, (sha, here["torch"], here["fullgraph"], here["device"], device_index)))


def read_json(file: str) -> dict[str, Any]:
    """A JSON object from `file` (the probe verdicts, the remembered hashes); {} when missing or unreadable."""
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(file: str, key: str, value: Any, keep: int | None = None) -> None:
    """Add `key` to the JSON memo `file` (the probe verdicts, the remembered hashes): read, changed and written
    atomically under the file's lock (`fullgraph._files.locked`), so that processes loading packages at once keep
    each other's entries. `keep`: the newest entries kept (None: all, sorted by key). Nothing is remembered where the
    cache folder cannot be written."""
    with contextlib.suppress(OSError), locked(file):
        memo = read_json(file)
        memo.pop(key, None)
        memo[key] = value
        if keep is not None:
            memo = dict(list(memo.items())[-keep:])
        write_atomic(file, json.dumps(memo, indent=1, sort_keys=keep is None))


def exit_text(rc: int) -> str:
    if rc >= 0:
        return f"exit {rc}"
    try:
        return f"exit {rc}, {signal.Signals(-rc).name}"
    except ValueError:
        return f"exit {rc}"


def run_probe(
    path: str, sha: str, device_index: int, timeout: float, ops: Sequence[str] = (), modules: Sequence[str] = ()
) -> dict[str, Any]:
    """`probe` for a package already checked, whose content hashes to `sha`, which calls `ops` through Python and
    needs `modules` imported for its pytree types (`load` reads the file once)."""
    file = os.path.join(cache_dir(), PROBE_FILE)
    key = probe_key(sha, device_index)
    verdict = read_json(file).get(key)
    if verdict is not None:
        return {**verdict, "cached": True}
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="fullgraph-probe-") as scratch:
            done = subprocess.run(
                probe_argv(os.path.abspath(path), device_index, ops, modules),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                env=probe_env(scratch),
            )
    except subprocess.TimeoutExpired:  # not cached: a slow machine is not a broken package
        raise DeployError(
            f"loading {display_path(path)} in a probe process took over {timeout:.0f} s; "
            "give a larger probe_timeout=, or probe_first=False if you trust the file"
        ) from None
    verdict = {
        "ok": done.returncode == 0,
        "rc": done.returncode,
        "detail": last_words(done.stderr + done.stdout) if done.returncode else "",
        "seconds": round(time.perf_counter() - start, 2),
        "path": os.path.abspath(path),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    # A pass or a death by signal belongs to this file here; an exit with a Python error may be the environment's
    # (a missing module), so it is probed again next time.
    if done.returncode <= 0:
        remember(file, key, verdict)  # a read-only cache folder costs a probe per load, nothing more
    return {**verdict, "cached": False}


def last_words(output: str) -> str:
    """What a dead child said last: faulthandler's "Fatal Python error" line and the innermost Python frame under
    it, else the last line (a Python error's)."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("Fatal Python error"):
            frame = next((f for f in lines[i + 1 :] if f.startswith("File ")), None)
            return f"{ln}, in {frame}"[:300] if frame else ln[:300]
    return lines[-1][:300] if lines else "no output"
