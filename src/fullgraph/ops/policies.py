"""Which implementation an op runs: "native" (pure PyTorch), "kernel" (Triton) or "auto".

Resolution, most specific first: the instance's own policy, the innermost `policy(...)` context of the calling
thread, the class default set with `set_policy(...)` (process-wide), the FULLGRAPH_OPS environment variable, then
"auto".

FULLGRAPH_OPS is read when fullgraph.ops is imported: `+rms_norm,-rope` (kernel for rms_norm, native for
rope), `all` / `none` (every op kernel / native), or `rms_norm=auto`.

"auto" means: in eager mode, the kernel wherever it can run on the input's device and the input is big enough
for a kernel to pay (`measured.eager_kernel_pays`); under torch.compile,
the implementation recorded as faster inside a compiled graph (`measured.py`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from enum import Enum

from fullgraph.errors import UsageError


class Policy(str, Enum):
    NATIVE = "native"
    KERNEL = "kernel"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: str | Policy, what: str = "policy") -> Policy:
        try:
            return cls(value)
        except ValueError:
            raise UsageError(f"{what}: unknown policy {value!r}; use 'native', 'kernel' or 'auto'") from None


# Op names that policies may name; each CustomOp subclass adds its own on definition.
KNOWN_OPS: set[str] = set()

# Dicts of plain strings: torch.compile guards on their contents, so a policy change recompiles. `set_policy` and the
# environment are the process's ("cls:<op>", "env:<op>"); a `policy(...)` block is its thread's ("ctx:<op>", the
# innermost), so a server thread running a tuned model under its policies does not change another thread's.
_state: dict[str, str] = {}
_local = threading.local()  # .ctx: this thread's context entries; .key: them as a sorted tuple, for version()


def _ctx() -> dict[str, str]:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = {}
    return ctx


def _ctx_changed() -> None:
    _local.key = tuple(sorted(_ctx().items()))


# The policy state as a hashable value, for eager callers that cache their choices per (version, device) and for
# compiled code's constants: the number of the process's settings (one per distinct state: returning to an earlier
# state gives back its number) and this thread's context entries. Read while Dynamo traces, so it takes no lock and
# changes nothing: a thread-local read and a list read, which Dynamo guards like any other.
_version = [0]
_state_ids: dict[tuple, int] = {}
_ids_lock = threading.Lock()


def version() -> tuple[int, tuple]:
    return _version[0], getattr(_local, "key", ())


def _changed() -> None:
    """The process's settings changed (never while tracing: set_policy, the environment, restore)."""
    with _ids_lock:
        _version[0] = _state_ids.setdefault(tuple(sorted(_state.items())), len(_state_ids))


# Which implementation ran, by (op, "eager"/"compiled", "native"/"kernel"): eager counts calls, compiled
# counts graphs traced with that choice baked in (counting compiled calls would cost a recompile per call).
counters: Counter = Counter()


def snapshot() -> dict[str, str]:
    """Every policy setting now in force for this thread (contexts, class defaults, environment), for `restore`."""
    return {**_state, **_ctx()}


def restore(saved: dict[str, str]) -> None:
    """Put back the settings of a `snapshot()` (a test's or a tool's cleanup after `set_policy`)."""
    _state.clear()
    _state.update({k: v for k, v in saved.items() if not k.startswith("ctx:")})
    ctx = _ctx()
    ctx.clear()
    ctx.update({k: v for k, v in saved.items() if k.startswith("ctx:")})
    _ctx_changed()
    _changed()


def _check_ops(names) -> None:
    unknown = sorted(set(names) - KNOWN_OPS - {"all"})
    if unknown:
        raise UsageError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN_OPS))}")


def parse_spec(spec: str) -> dict[str, Policy]:
    """Parse FULLGRAPH_OPS syntax into {op or "all": policy}."""
    out: dict[str, Policy] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item in ("all", "none"):
            out["all"] = Policy.KERNEL if item == "all" else Policy.NATIVE
        elif item[0] in "+-" and item[1:].strip():
            out[item[1:]] = Policy.KERNEL if item[0] == "+" else Policy.NATIVE
        elif "=" in item:
            name, value = item.split("=", 1)
            out[name.strip()] = Policy.parse(value.strip(), f"FULLGRAPH_OPS {name.strip()}")
        else:
            raise UsageError(f"FULLGRAPH_OPS: cannot read {item!r}; write +op, -op, op=auto, all or none")
    return out


def check_spec(spec: str) -> dict[str, Policy]:
    """`parse_spec`, with every op name checked against the known ops (a one-line UsageError otherwise)."""
    parsed = parse_spec(spec)
    _check_ops(parsed)
    return parsed


def load_env(spec: str | None = None) -> None:
    """(Re)read FULLGRAPH_OPS (or `spec`). Unknown op names are checked when a policy is resolved."""
    for key in [k for k in _state if k.startswith("env:")]:
        del _state[key]
    for name, pol in parse_spec(os.environ.get("FULLGRAPH_OPS", "") if spec is None else spec).items():
        _state[f"env:{name}"] = pol.value
    _changed()


def check_env() -> None:
    """Raise if FULLGRAPH_OPS names an op that does not exist (called once every op is defined)."""
    _check_ops([k.split(":", 1)[1] for k in _state if k.startswith("env:")])


def set_policy(**ops: str | Policy) -> None:
    """Class-level default for each named op, e.g. `set_policy(rms_norm="kernel")`; `all=` sets every op."""
    _check_ops(ops)
    for name, value in ops.items():
        _state[f"cls:{name}"] = Policy.parse(value, name).value
    _changed()


@contextlib.contextmanager
def policy(**ops: str | Policy):
    """Within the block, use these policies: `with policy(rms_norm="kernel", rope="native"): ...`."""
    _check_ops(ops)
    parsed = {f"ctx:{name}": Policy.parse(value, name).value for name, value in ops.items()}
    ctx = _ctx()
    saved = {k: ctx.get(k) for k in parsed}
    ctx.update(parsed)
    _ctx_changed()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                ctx.pop(k, None)
            else:
                ctx[k] = v
        _ctx_changed()


def effective(op: str, instance: str | None = None) -> str:
    """The policy in force for `op` (a plain string, so compiled code can guard on it)."""
    if instance is not None:
        return instance
    ctx = getattr(_local, "ctx", None)
    if ctx:
        for name in (op, "all"):
            value = ctx.get(f"ctx:{name}")
            if value is not None:
                return value
    for scope in ("cls", "env"):
        for name in (op, "all"):
            value = _state.get(f"{scope}:{name}")
            if value is not None:
                return value
    return Policy.AUTO.value


load_env()
