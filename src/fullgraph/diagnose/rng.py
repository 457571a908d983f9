"""Models whose output is not a function of their inputs alone: random numbers drawn in forward (ViTMAE's masking,
a diffusion policy's noise, dropout left on), or state kept across calls.

Compared call by call against eager float32, such a model fails every row, eager's own included (transformers'
ViTMAE, random weights, on the CPU: eager fp32 at rel err 3.3 against its own reference, "no configuration ran
within tolerance"), and the doctor would report broken numerics that are not. So the doctor reads the random ops
of one eager call (the aten ops torch tags `nondeterministic_seeded`, each with the user's line that drew it),
calls the reference twice, and when the model draws random numbers, makes every check call with torch's
generators seeded alike. Eager rows then reproduce eager's draws; compiled code draws its own (Inductor generates
random numbers in its kernels unless `torch._inductor.config.fallback_random` is set), so a compiled row whose
seeded output differs is checked again through a compile with `fallback_random=True`, which draws as eager does:
its numerics are then the compiled code's, its timing stays the row's own.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fullgraph._paths import display_path

SEED = 20261206  # the seed every check call starts from, when the model draws random numbers

_SKIP = (os.sep + "torch" + os.sep, os.sep + "fullgraph" + os.sep, os.sep + "contextlib.py")


@dataclass(frozen=True)
class RandomDraw:
    """One place in the model's code that drew random numbers during a call."""

    op: str  # "aten.rand"
    where: str  # "transformers/models/vit_mae/modeling_vit_mae.py:241", or "" where no frame outside torch is
    count: int  # draws there in one call

    def __str__(self) -> str:
        times = f" ({self.count} draws)" if self.count > 1 else ""
        return f"{self.op} at {self.where}{times}" if self.where else f"{self.op}{times}"


class _Draws(TorchDispatchMode):
    """Records every op tagged nondeterministic_seeded, with the innermost frame outside torch and fullgraph."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, str], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs or {}):
            where = ""
            for frame in reversed(traceback.extract_stack()):
                if not any(s in frame.filename for s in _SKIP):
                    where = f"{display_path(frame.filename)}:{frame.lineno}"
                    break
            key = (str(func.overloadpacket), where)
            self.seen[key] = self.seen.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def _draws(func: Any, args: tuple, kwargs: dict) -> bool:
    """Does this call of an op tagged nondeterministic_seeded draw? Attention and dropout ops carry the tag for
    their dropout, which draws nothing at probability 0 (every SDPA call of an inference model) or when not
    training (`native_dropout(x, p, train=False)`)."""
    named = dict(kwargs)
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args):
            named[arg.name] = args[i]
        elif arg.name not in named and arg.has_default_value():
            named[arg.name] = arg.default_value
    p = named.get("dropout_p", named.get("p") if "dropout" in func._schema.name else None)
    if p is not None and not (isinstance(p, (int, float)) and p > 0):
        return False
    return named.get("train", True) is not False


def random_draws(call: Callable[[], Any]) -> list[RandomDraw]:
    """The random numbers one call of `call` draws, by op and place (none: []). A model that cannot run under a
    dispatch mode (a custom op without one) counts as drawing none: the reference's second call still shows a
    model whose output varies."""
    mode = _Draws()
    try:
        with torch.no_grad(), mode:
            call()
    except Exception:
        return []
    return [RandomDraw(op, where, n) for (op, where), n in mode.seen.items()]


@contextlib.contextmanager
def seeded(device: torch.device, seed: int = SEED) -> Iterator[None]:
    """torch's generators (the CPU's and `device`'s) seeded with `seed` inside, put back as they were after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def maybe_seeded(device: torch.device, on: bool) -> contextlib.AbstractContextManager:
    return seeded(device) if on else contextlib.nullcontext()


def describe(draws: list[RandomDraw], limit: int = 3) -> str:
    """ "aten.rand at x.py:12, aten.randn at y.py:40 and 2 more places"."""
    shown = ", ".join(str(d) for d in draws[:limit])
    return shown + (f" and {len(draws) - limit} more places" if len(draws) > limit else "")


__all__ = ["SEED", "RandomDraw", "describe", "maybe_seeded", "random_draws", "seeded"]
