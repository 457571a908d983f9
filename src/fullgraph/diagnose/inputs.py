"""Example inputs of any structure: positional and keyword arguments, each any pytree of tensors and Python values.

A detection model takes a list of images, a transformers model `input_ids=` and `attention_mask=`, the chapter's
exercise 2.5 a tensor and a float. The doctor calls, casts, varies and describes all of them the same way here.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path, tree_map

from fullgraph.errors import UsageError

VARY_DIM = {"batch": 0, "seq": 1}


def _short_dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spec_of(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) + ":" + _short_dtype(t.dtype)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return spec_of(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v) for v in value[:4]) + (", …" if len(value) > 4 else "")
        return f"{type(value).__name__}[{len(value)}]({inner})"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in value.items()) + "}"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _fresh_like(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """A random tensor of `t`'s dtype and device with `shape`: floats normal, ints within `t`'s range, bools coin flips.

    Integer inputs are often indices (token ids) or masks, so new values stay within [min, max] of the original."""
    if t.is_floating_point() or t.is_complex():
        return torch.randn(shape, dtype=t.dtype, device=t.device)
    if t.dtype == torch.bool:
        return torch.rand(shape, device=t.device) > 0.5
    lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 1)
    return torch.randint(lo, hi + 1, shape, dtype=t.dtype, device=t.device)


@dataclass(frozen=True)
class Example:
    """One call's inputs: `fn(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, args: Any = (), kwargs: Mapping[str, Any] | None = None) -> Example:
        """From what a user passes: a tuple of arguments, or one argument (a tensor, a list of images) alone."""
        if not isinstance(args, tuple):
            args = (args,)
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise UsageError(f"keyword inputs must be a dict of name -> value, not {type(kwargs).__name__}")
        return cls(args, dict(kwargs or {}))

    def call(self, fn: Callable[..., Any]) -> Any:
        return fn(*self.args, **self.kwargs)

    def tensors(self) -> list[torch.Tensor]:
        leaves, _ = tree_flatten((self.args, self.kwargs))
        return [v for v in leaves if isinstance(v, torch.Tensor)]

    @property
    def device(self) -> torch.device:
        """The device of the first tensor (the model's inputs are on one device); the CPU when there is none."""
        tensors = self.tensors()
        return tensors[0].device if tensors else torch.device("cpu")

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Example:
        args, kwargs = tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, (self.args, self.kwargs))
        return Example(tuple(args), dict(kwargs))

    def to(self, device: torch.device) -> Example:
        return self.map_tensors(lambda t: t.to(device))

    def fresh(self) -> Example:
        """A copy whose tensors are new: calls on it cannot write into these (a forward that updates its inputs in
        place)."""
        return self.map_tensors(lambda t: t.detach().clone().requires_grad_(t.requires_grad))

    def written(self, call: Callable[[Example], Any]) -> list[str]:
        """The inputs `call` writes into in place, by name ("args[0]", "kwargs['mask']"), read on a fresh copy whose
        values are compared before and after (NaN equal to NaN); [] when it writes none."""
        copy = self.fresh()
        before = copy.fresh()
        call(copy)
        named = tree_flatten_with_path((before.args, before.kwargs))[0]
        after = tree_flatten((copy.args, copy.kwargs))[0]
        names = []
        for (path, b), a in zip(named, after, strict=True):
            if isinstance(b, torch.Tensor) and not _same(b, a):
                names.append(_input_name(keystr(path)))
        return names

    def cast(self, dtype: torch.dtype) -> Example:
        """Every floating tensor in `dtype`; integer and bool tensors (ids, masks) and Python values unchanged."""
        return self.map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t)

    def floating_dtype(self) -> torch.dtype | None:
        return next((t.dtype for t in self.tensors() if t.is_floating_point()), None)

    def describe(self) -> list[str]:
        """One string per argument: `4x3x224x224:float32`, `list[2](3x480x640:float32, …)`, `mask=2x16:int64`."""
        return [_describe(a) for a in self.args] + [f"{k}={_describe(v)}" for k, v in self.kwargs.items()]

    def vary(self, kind: str, step: int = 1) -> Example | None:
        """The inputs a user would send next: another batch size or sequence length (`step` picks which new size).

        Every tensor that carries the dim is changed (the size shared by most tensors at that dim, so input_ids and
        attention_mask move together); a list of tensors at the top (images) varies in length for "batch".
        None when nothing carries the dim."""
        if kind not in VARY_DIM:
            raise UsageError(f"--vary {kind!r}: choose from {', '.join(VARY_DIM)}")
        dim = VARY_DIM[kind]
        if kind == "batch" and any(_tensor_list(a) for a in self.args):
            return self._vary_list_length(step)
        sizes = collections.Counter(t.shape[dim] for t in self.tensors() if t.dim() > dim)
        if not sizes:
            return None
        old = sizes.most_common(1)[0][0]
        new = old * (step + 1) + 1  # odd and new at each step: no multiple the first compile might have assumed

        def change(t: torch.Tensor) -> torch.Tensor:
            if t.dim() <= dim or t.shape[dim] != old:
                return t
            shape = list(t.shape)
            shape[dim] = new
            return _fresh_like(t, shape)

        return self.map_tensors(change)

    def _vary_list_length(self, step: int) -> Example:
        def grow(a: Any) -> Any:
            if not _tensor_list(a):
                return a
            extra = [_fresh_like(a[i % len(a)], list(a[i % len(a)].shape)) for i in range(len(a) * step + 1)]
            return type(a)([*a, *extra]) if isinstance(a, list) else (*a, *extra)

        return Example(tuple(grow(a) for a in self.args), self.kwargs)


def _tensor_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in any output: a tensor, tuple, dict, dataclass-like ModelOutput (a dict subclass) or list;
    Python numbers among them as 0-d tensors (a forward returning `float(loss)`), strings and None left out."""
    leaves, _ = tree_flatten(value)
    out = [
        v if isinstance(v, torch.Tensor) else torch.tensor(v)
        for v in leaves
        if isinstance(v, (torch.Tensor, int, float, complex))
    ]
    if not out and hasattr(value, "to_tuple"):  # transformers' ModelOutput, where pytree does not know it
        return flat_tensors(value.to_tuple())
    return out


def _same(b: torch.Tensor, a: torch.Tensor) -> bool:
    """Equal shapes and values, NaN equal to NaN."""
    if b.shape != a.shape or b.dtype != a.dtype:
        return False
    if b.is_floating_point() or b.is_complex():
        return bool(torch.allclose(b, a, rtol=0.0, atol=0.0, equal_nan=True))
    return torch.equal(b, a)


def _input_name(path: str) -> str:
    """keystr's path into (args, kwargs) as a reader writes it: "[0][1]" -> "args[1]", "[1]['mask']" -> "mask"."""
    head, _, rest = path[1:].partition("]")
    if head == "0":
        return "args" + rest
    key = re.match(r"\[(['\"])(.*?)\1\](.*)", rest)
    return key.group(2) + key.group(3) if key else "kwargs" + rest
