"""Static input buffers for a whole model replayed from Inductor's CUDA graph trees.

A replayed graph reads its inputs from fixed addresses, so CUDA graph trees copy every input that is not static (a
parameter, a buffer, or a tensor marked with `torch._dynamo.mark_static_address`) into its own memory before each
replay, with one `torch._foreach_copy_`. That copy is a multi-tensor kernel with one program per 64 Ki elements: for
a batch of 4 images of 3x224x224 in bf16 (1.2 MB) it took 14.5 us on the H200, ~2.5% of ViT-B/16's 0.617 ms
(`benchmarks/results/vit_h200.txt`, 2026-12-02), where a plain copy of that size takes ~1-2 us at memory bandwidth.

`Staging` keeps one buffer per input and shape, marked static (unguarded: the graph compiled for a shape always
gets the same buffer, and CUDA graph trees re-record rather than misread should an address ever change), copies the
caller's tensor into it with a plain `copy_`, and passes the buffer instead. What the caller sees is unchanged: the
outputs are the graph's as before, and the caller's tensors are only read.

A model that returns one of its inputs (or a view of it) would hand the caller the buffer, which the next call
refills: the first call of each new buffer checks the outputs, and once one shared a buffer's memory, every call
checks them and returns such outputs as copies (the graphs were compiled for the buffers: passing the caller's
tensors instead would make the trees re-record at every new address).

Limits: top-level tensor arguments on a CUDA device only (nested containers pass through: trees copy those as
before); at most MAX_SHAPES buffers per input name, the oldest dropped after (its graph re-records on return). A
model that writes into its input would write into the buffer, not the caller's tensor: inference models do not, and
`fullgraph.compile` stages only configurations that replay CUDA graphs over a whole model with fixed shapes.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

MAX_SHAPES = 8


class Staging:
    """Stage a call's top-level CUDA tensors into static buffers (see the module docstring)."""

    def __init__(self, names: list[str], device_type: str = "cuda"):
        self._names = names  # positional parameter names, for keys that survive args given by keyword
        self._device_type = device_type
        self._buffers: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._created: list[torch.Tensor] = []  # buffers this call made, whose outputs `checked` looks at
        self.aliased = False  # an output shared a buffer's memory: `checked` looks at every call's outputs

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self._created = []
        names = self._names
        args = tuple(self._stage(names[i] if i < len(names) else i, a) for i, a in enumerate(args))
        if kwargs:
            kwargs = {k: self._stage(k, v) for k, v in kwargs.items()}
        return args, kwargs

    def _stage(self, name: Any, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.device.type != self._device_type or value.requires_grad:
            return value
        if not (value.is_contiguous() or value.is_contiguous(memory_format=torch.channels_last)):
            return value  # expanded or gappy views: the trees' own copy handles their layout
        key = (name, value.shape, value.stride(), value.dtype, value.device)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
            torch._dynamo.mark_static_address(buf, guard=False)
            self._buffers[key] = buf
            self._created.append(buf)
            if sum(1 for k in self._buffers if k[0] == name) > MAX_SHAPES:
                del self._buffers[next(k for k in self._buffers if k[0] == name)]
        if buf is not value:
            buf.copy_(value)
        return buf

    def checked(self, out: Any) -> Any:
        """The call's output, any tensor of it that shares a staged buffer's memory returned as a copy: checked after
        the first call of a new buffer, and at every call once one did (see the module docstring)."""
        if not self._created and not self.aliased:
            return out
        buffers = self._created if not self.aliased else self._buffers.values()
        staged = {b.untyped_storage().data_ptr() for b in buffers}
        self._created = []

        def own(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() in staged:
                self.aliased = True
                return t.clone()
            return t

        return tree_map_only(torch.Tensor, own, out)

    def __len__(self) -> int:
        return len(self._buffers)
