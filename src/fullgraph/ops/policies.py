"""Which implementation an op runs: "native" (pure PyTorch), "kernel" (Triton) or "auto".

Resolution, most specific first: the instance's own policy, the innermost `policy(...)` context, the
class default set with `set_policy(...)`, the FULLGRAPH_OPS environment variable, then "auto".

FULLGRAPH_OPS is read when fullgraph.ops is imported: `+rms_norm,-rope` (kernel for rms_norm, native for
rope), `all` / `none` (every op kernel / native), or `rms_norm=auto`.

"auto" means: in eager mode, the kernel wherever it can run on the input's device and the input is big enough
for a kernel to pay (`measured.eager_kernel_pays`); under torch.compile,
the implementation recorded as faster inside a compiled graph (`measured.py`).
"""

from __future__ import annotations

import contextlib
import os
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

# A dict of plain strings: torch.compile guards on its contents, so a policy change recompiles.
_state: dict[str, str] = {}  # "ctx:<op>" (innermost context), "cls:<op>" (set_policy), "env:<op>"

# A number per distinct policy state, set on every change: eager callers cache their choices per (version,
# device). Returning to an earlier state (leaving a `policy(...)` block) gives back its number, so a block
# entered on every call does not throw away what the calls inside it chose.
_version = [0]
_state_ids: dict[tuple, int] = {}


def version() -> int:
    return _version[0]


def _changed() -> None:
    _version[0] = _state_ids.setdefault(tuple(sorted(_state.items())), len(_state_ids))


# Which implementation ran, by (op, "eager"/"compiled", "native"/"kernel"): eager counts calls, compiled
# counts graphs traced with that choice baked in (counting compiled calls would cost a recompile per call).
counters: Counter = Counter()


def snapshot() -> dict[str, str]:
    """Every policy setting now in force (contexts, class defaults, environment), for `restore`."""
    return dict(_state)


def restore(saved: dict[str, str]) -> None:
    """Put back the settings of a `snapshot()` (a test's or a tool's cleanup after `set_policy`)."""
    _state.clear()
    _state.update(saved)
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
    saved = {k: _state.get(k) for k in parsed}
    _state.update(parsed)
    _changed()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                _state.pop(k, None)
            else:
                _state[k] = v
        _changed()


def effective(op: str, instance: str | None = None) -> str:
    """The policy in force for `op` (a plain string, so compiled code can guard on it)."""
    if instance is not None:
        return instance
    for scope in ("ctx", "cls", "env"):
        for name in (op, "all"):
            value = _state.get(f"{scope}:{name}")
            if value is not None:
                return value
    return Policy.AUTO.value


load_env()
