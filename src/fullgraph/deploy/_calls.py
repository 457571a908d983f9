"""What a loaded package's call that failed is told apart by, on the error path only (nothing here runs on a call
that works): inputs that do not fit the shapes it was exported for, and the GPU running out of memory.

A package's own input checks say what did not fit in words on the CPU ("input_handles[0]: unmatched dim value at
0, ..."), but on a GPU its runtime prints them and raises torch's generic `RuntimeError: run_func_(
container_handle_, ...) API call failed` (H200, torch 2.11), the same error that an out-of-memory inside it becomes.
So the inputs are compared with those recorded at export (`misfit`), and torch's count of out-of-memory events on
the device is read (`OomCount`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

# One tensor in `input_signature`'s text: "4x3x224x224:float32@cuda" (":float32@cpu" for a 0-dim tensor).
_TENSOR = re.compile(r"((?:\d+x)*\d+|):(\w+)@(\w+)")
Ranges = Mapping[int, Sequence[int]]


def tensor_specs(signature: str) -> list[tuple[tuple[int, ...], str, str]]:
    """The tensors of an `input_signature` text, each as (shape, dtype, device type); other inputs are left out."""
    specs = []
    for part in signature.split(", "):
        found = _TENSOR.fullmatch(part.strip())
        if found:
            shape = tuple(int(s) for s in found.group(1).split("x")) if found.group(1) else ()
            specs.append((shape, found.group(2), found.group(3)))
    return specs


def dynamic_ranges(metadata: Mapping[str, str], prefix: str) -> dict[int | None, dict[int, Sequence[int]]]:
    """The declared dynamic dims of a package by tensor input index (`export` records them so:
    `<prefix>flat_dynamic`); for a package that records them by input name only, every input under key None (each
    declared dim free within the widest of its ranges: a lenient reading, never a false refusal)."""
    try:
        flat = json.loads(metadata.get(prefix + "flat_dynamic") or "null")
        if isinstance(flat, dict):
            return {int(i): {int(d): r for d, r in dims.items()} for i, dims in flat.items()}
        named = json.loads(metadata.get(prefix + "dynamic") or "{}")
    except (ValueError, TypeError, AttributeError):
        return {None: {}}
    merged: dict[int, list[int]] = {}
    for dims in named.values() if isinstance(named, dict) else ():
        for d, (lo, hi) in dims.items():
            old = merged.get(int(d), [lo, hi])
            merged[int(d)] = [min(lo, old[0]), max(hi, old[1])]
    return {None: merged}


def misfit(given: str, exported: str | None, dynamic: Mapping[int | None, Ranges]) -> str | None:
    """How inputs `given` (an `input_signature`) differ from those a package was `exported` for, with its declared
    `dynamic` dims (`dynamic_ranges`), in a few words; None when they fit (or nothing was recorded)."""
    if not exported:
        return None
    want, got = tensor_specs(exported), tensor_specs(given)
    if len(got) != len(want):
        return f"{len(got)} tensor inputs given, it takes {len(want)}"
    for i, ((shape, dtype, device), (w_shape, w_dtype, w_device)) in enumerate(zip(got, want, strict=True)):
        if (dtype, device) != (w_dtype, w_device):
            return f"input {i} is {dtype} on {device}, it takes {w_dtype} on {w_device}"
        if len(shape) != len(w_shape):
            return f"input {i} has {len(shape)} dims, it takes {len(w_shape)}"
        ranges = dynamic.get(i, dynamic.get(None, {}))
        for d, (size, w_size) in enumerate(zip(shape, w_shape, strict=True)):
            declared = ranges.get(d, ranges.get(d - len(shape)))
            if declared is not None and not declared[0] <= size <= declared[1]:
                return f"dim {d} of input {i} is {size}, outside its declared range {declared[0]}..{declared[1]}"
            if declared is None and size != w_size:
                return f"dim {d} of input {i} is {size}, exported fixed at {w_size}"
    return None


class OomCount:
    """torch's count of out-of-memory events on the CUDA device of a call's inputs, read on the error path: a count
    that rose since the last reading says that the failure was the GPU's memory, whatever words it came in."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    @staticmethod
    def read(device: torch.device) -> int:
        return int(torch.cuda.memory_stats(device).get("num_ooms", 0))

    def start(self, device: torch.device) -> None:
        """Take the baseline (at load, on the package's device)."""
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            self._seen[index] = self.read(torch.device("cuda", index))

    def rose(self, device: torch.device | None) -> bool:
        """Did the count rise on `device` (a CUDA device, `cuda_device`; None: no) since the last reading? It is read
        again either way."""
        if device is None:
            return False
        try:
            now = self.read(device)
        except Exception:  # an allocator without stats (another backend): unknown, so no
            return False
        before = self._seen.get(device.index, now)
        self._seen[device.index] = now
        return now > before


def cuda_device(args: Any, kwargs: Mapping[str, Any] | None) -> torch.device | None:
    """The CUDA device of the first CUDA tensor among a call's inputs, or None."""
    leaves = tree_leaves((args, dict(kwargs or {})))
    return next((t.device for t in leaves if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
