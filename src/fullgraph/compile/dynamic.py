"""Declared dynamic dims and padding to shape buckets (issue 12; DESIGN.md errata 3 and 5).

Two ways to serve a stream of varying sizes without a recompile storm:

- `declare_dynamic` marks named input dims dynamic with a range before the call, so Dynamo compiles one
  symbolic graph for the range up front instead of one graph per size until "automatic dynamic" kicks in
  (errata 5). `torch.compile(dynamic={"x": ...})` is not an API (errata 3); `mark_dynamic` on the input is.
- `Bucketed` pads inputs to the next of a few fixed sizes and slices the outputs back: static shapes per
  bucket, so each bucket compiles once, gets code specialized to its size, and can replay a CUDA graph.

Inputs are named as Python would index them: the argument name, then subscripts into lists, tuples and dicts:
``x``, ``images[0]``, ``batch['pixels']`` (double quotes are accepted). Arguments caught by ``**kwargs`` are
named by their keyword; those caught by ``*args`` as ``args[0]``. Outputs are named the same way from
``output``: ``output``, ``output[1]``, ``output['logits']``.
"""

import bisect
import contextlib
import inspect
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fullgraph.errors import UsageError
from fullgraph.serving import CallGuard, copy_out

Range = tuple[int, int]
DynamicSpec = Mapping[str, Mapping[int, Range]]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_range(size_range: object, what: str) -> Range:
    """A ``(min, max)`` size range, both inclusive, as two ints with 0 <= min <= max."""
    if not (isinstance(size_range, (tuple, list)) and len(size_range) == 2 and all(map(_is_int, size_range))):
        raise UsageError(f"{what}: range {size_range!r} must be two ints (min, max), e.g. (1, 32)")
    lo, hi = size_range
    if lo < 0:
        raise UsageError(f"{what}: min {lo} < 0; sizes start at 0, e.g. (1, {max(hi, 1)})")
    if lo > hi:
        raise UsageError(f"{what}: min {lo} > max {hi}; swap them: ({hi}, {lo})")
    return lo, hi


def _norm_path(path: object, what: str) -> str:
    if not isinstance(path, str) or not path:
        raise UsageError(f"{what} {path!r} must be a name such as 'x', 'images[0]' or \"batch['pixels']\"")
    return path.replace('"', "'").replace(" ", "")


def check_dynamic_spec(spec: object) -> dict[str, dict[int, Range]]:
    """Validate a spec's form without inputs, so a bad range fails before anything is traced or compiled.

    A spec maps an input name (see the module docstring) to ``{dim: (min, max)}``, e.g. ``{"x": {0: (1, 32)}}``.
    """
    if not isinstance(spec, Mapping):
        raise UsageError(f"a dynamic spec is a dict like {{'x': {{0: (1, 32)}}}}, not {type(spec).__name__}")
    out: dict[str, dict[int, Range]] = {}
    for path, dims in spec.items():
        name = _norm_path(path, "dynamic input")
        if not isinstance(dims, Mapping) or not dims:
            raise UsageError(f"dynamic spec for {path!r} is {dims!r}; give {{dim: (min, max)}}, e.g. {{0: (1, 32)}}")
        for dim in dims:
            if not _is_int(dim):
                raise UsageError(f"dynamic spec for {path!r}: dim {dim!r} must be an int, e.g. {{0: (1, 32)}}")
        out[name] = {dim: check_range(rng, f"{path} dim {dim}") for dim, rng in dims.items()}
    return out


def _signature(model: Callable) -> inspect.Signature:
    """The signature that names the inputs: a module's forward, seen through torch.compile's wrapper (kept per
    forward function: `declare_dynamic` runs on every call, and reading a signature costs tens of µs)."""
    inner = getattr(model, "_orig_mod", model)
    fn = inner.forward if isinstance(inner, torch.nn.Module) else inner
    key = getattr(fn, "__func__", fn)  # a bound forward is a new object per access; its function is not
    found = _signatures.get(key)
    if found is not None and found[0] == inspect.ismethod(fn):
        return found[1]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise UsageError(f"cannot read the signature of {fn!r} to name its inputs ({e}); wrap it in a def") from e
    with contextlib.suppress(TypeError):  # not weak-referenceable: read again next time
        _signatures[key] = (inspect.ismethod(fn), sig)
    return sig


_signatures: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bind(sig: inspect.Signature, args: Sequence, kwargs: Mapping) -> inspect.BoundArguments:
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as e:
        raise UsageError(f"the inputs do not fit the model's signature {sig}: {e}") from e


def _named(bound: inspect.BoundArguments) -> dict[str, Any]:
    """Inputs by name; what ``**kwargs`` caught is named by its own keyword."""
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if bound.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def _call(model: Callable, bound: inspect.BoundArguments, named: Mapping[str, Any]) -> Any:
    """Call the model with `named` put back where `bound` had each input (positional stays positional)."""
    params = bound.signature.parameters
    for name, p in params.items():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            bound.arguments[name] = {k: v for k, v in named.items() if k not in params}
        elif name in named:
            bound.arguments[name] = named[name]
    return model(*bound.args, **bound.kwargs)


def _render(keypath: Sequence, root: str = "") -> str:
    parts = [root]
    for i, k in enumerate(keypath):
        if isinstance(k, pytree.MappingKey):
            parts.append(str(k.key) if i == 0 and not root else f"[{k.key!r}]")
        elif isinstance(k, pytree.SequenceKey):
            parts.append(f"[{k.idx}]")
        elif isinstance(k, pytree.GetAttrKey):
            parts.append(f".{k.name}")
        else:
            parts.append(str(k))
    return "".join(parts)


def _root(path: str) -> str:
    return re.match(r"[^\[.]*", path).group()


def declare_dynamic(
    model: Callable, args: Sequence = (), kwargs: Mapping | None = None, spec: DynamicSpec = ()
) -> list[str]:
    """Mark the dims named in `spec` dynamic on these inputs, with their ranges, before calling compiled `model`.

    ``declare_dynamic(cm, (x,), {}, {"x": {0: (1, 32)}})`` then ``cm(x)``: Dynamo compiles one graph for sizes
    2..32 of ``x``'s dim 0. Call it on every call's inputs (marks live on the tensor objects). Everything is
    validated before any tensor is marked: an unknown name (the valid ones are listed), a path that does not
    lead to a tensor, a dim out of range, a bad range, a size outside its declared range.

    Dynamo specializes sizes 0 and 1 (marking a size-1 dim dynamic makes the compile fail), so an input whose
    size is 0 or 1 is left unmarked and compiles its own graph: a range starting at 1 costs 2 graphs (size 1,
    then 2..max), one starting at 0 costs 3. A single-size range is static and is not marked either.
    Returns notes saying so, one per range that starts below 2.
    """
    spec = check_dynamic_spec(spec)
    named = _named(_bind(_signature(model), args, kwargs or {}))
    if all(isinstance(named.get(path), torch.Tensor) for path in spec):  # every path an input tensor: no walk
        tensors = {path: named[path] for path in spec}
    else:
        leaves, _ = pytree.tree_flatten_with_path(named)
        tensors = {_render(kp): v for kp, v in leaves if isinstance(v, torch.Tensor)}
    marks, notes = [], []
    for path, dims in spec.items():
        root = _root(path)
        if root not in named:
            raise UsageError(
                f"dynamic spec names {root!r}, which is not an input; inputs: {', '.join(named) or 'none'}"
            )
        if path not in tensors:
            under = [p for p in tensors if _root(p) == root]
            hint = f"tensors there: {', '.join(under)}" if under else f"{root!r} holds no tensor"
            raise UsageError(f"dynamic spec path {path!r} does not lead to a tensor; {hint}")
        t = tensors[path]
        for dim, (lo, hi) in dims.items():
            if not -t.ndim <= dim < t.ndim:
                valid = f"use 0..{t.ndim - 1} or {-t.ndim}..-1" if t.ndim else "it is a 0-dim tensor"
                raise UsageError(f"{path} has {t.ndim} dims, so dim {dim} is out of range; {valid}")
            size = t.shape[dim]
            if not lo <= size <= hi:
                raise UsageError(f"{path} dim {dim} has size {size}, outside its declared range ({lo}, {hi})")
            if lo < 2:
                special = [str(v) for v in (0, 1) if lo <= v <= hi]
                rest = "" if hi < 2 else ", beside the one for " + ("size 2" if hi == 2 else f"sizes 2..{hi}")
                notes.append(
                    f"{path} dim {dim}: range ({lo}, {hi}) includes size{'s' * (len(special) > 1)} "
                    f"{' and '.join(special)}, which Dynamo specializes: one graph each{rest}"
                )
            if size >= 2 and max(lo, 2) < hi:
                marks.append((t, dim % t.ndim, max(lo, 2), hi))
    for t, dim, lo, hi in marks:
        torch._dynamo.mark_dynamic(t, dim, min=lo, max=hi)
    return notes


def check_buckets(buckets: object) -> tuple[int, ...]:
    """Bucket sizes: a non-empty, strictly increasing sequence of positive ints."""
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
        raise UsageError(f"buckets {buckets!r} must be a non-empty sequence of sizes, e.g. (1, 2, 4, 8, 16, 32)")
    bad = [b for b in buckets if not _is_int(b) or b < 1]
    if bad:
        raise UsageError(f"buckets {tuple(buckets)} hold {bad[0]!r}; every bucket is a positive int")
    dup = sorted({b for b in buckets if list(buckets).count(b) > 1})
    if dup:
        raise UsageError(f"buckets {tuple(buckets)} repeat {dup[0]}; list each size once")
    if list(buckets) != sorted(buckets):
        raise UsageError(f"buckets {tuple(buckets)} are not sorted; write {tuple(sorted(buckets))}")
    return tuple(buckets)


def _close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    """Equal up to rounding (relative to the output's scale): a leak through padding is far larger than that."""
    if not a.is_floating_point():
        return torch.equal(a, b), float("nan")
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    tol = 1e-2 if a.element_size() <= 2 else 1e-5
    return diff <= tol * max(1.0, a.abs().max().item() if a.numel() else 0.0), diff


class Bucketed(torch.nn.Module):
    """Pad inputs along `dim` to the next bucket, call `model`, slice batch-aligned outputs back to the true size.

    Bucketed does not compile: pass a compiled model, ``Bucketed(torch.compile(m, dynamic=False), ...)``, and
    compile the model inside, never the wrapper (the wrapper's shapes vary by design). With ``dynamic=False``
    each bucket is one static graph (at most ``len(buckets)`` compiles, CUDA graphs replayable under
    ``mode="reduce-overhead"``); Dynamo's ``recompile_limit`` (8 by default) must be at least the bucket count,
    or the sizes past it run eager. With the default ``dynamic=None``, the second bucket turns the dim symbolic.

    Threads: around a `CompiledModel` the model's own guard serves (fullgraph.serving; its outputs are already its
    caller's own, so the slices are too). Around anything else (a plain `torch.compile`d model, say) Bucketed holds a
    guard of its own across the call and returns copies of the slices, and the CUDA-graph trees of what it calls
    keep one state whichever thread calls. A new bucket arriving on several threads at once compiles once.

    Batch-carrying inputs: every tensor whose size along `dim` equals that of the first tensor with such a dim
    (or only those named in `batch_args`, by name or path); others pass unchanged. A size above the largest
    bucket is an error naming both, not chunked: chunks would run in sequence (a latency spike the caller should
    see) and would split a sequence `dim` that a mask ties together.

    Outputs: every tensor output must be batch-aligned (its `dim` has the padded size) and is sliced back, or,
    with `batch_outputs` naming some (``"output[0]"``, ``"output['logits']"``), those are sliced and the rest
    returned as the model gave them. Anything else raises, naming the output (e.g. a reduction over the batch).

    What keeps padding out of the results: positions along `dim` below the true size see no padded value when
    the model treats positions independently (per-sample models along the batch), or when every interaction
    across positions is gated by `mask_arg`: that argument is padded with zeros whatever `pad_value` is, and if
    the caller omits it, Bucketed passes ``ones(shape[:dim + 1])`` (int64, the Hugging Face convention) of the
    first batch input, zero over the padding. It cannot prove either from outside, so with `check_padding` the
    first call that pads runs the model a second time with other padding (copies of the first real position)
    and raises if any sliced output changes, naming it. Shapes are equal, so the check compiles nothing.
    """

    def __init__(
        self,
        model: Callable,
        dim: int = 0,
        buckets: Sequence[int] = (1, 2, 4, 8, 16, 32),
        *,
        pad_value: float = 0,
        batch_outputs: Sequence[str] | None = None,
        mask_arg: str | None = None,
        batch_args: Sequence[str] | None = None,
        check_padding: bool = True,
    ) -> None:
        super().__init__()
        if not _is_int(dim) or dim < 0:
            raise UsageError(f"Bucketed dim {dim!r} must be an int >= 0 (the dim counted from the front)")
        self.model = model
        self.dim = dim
        self.buckets = check_buckets(buckets)
        self.pad_value = pad_value
        self.batch_outputs = None if batch_outputs is None else {_norm_path(p, "batch output") for p in batch_outputs}
        self.batch_args = None if batch_args is None else {_norm_path(p, "batch arg") for p in batch_args}
        self._sig = _signature(model)
        params = self._sig.parameters
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for name in {mask_arg, *map(_root, self.batch_args or ())} - {None}:
            if name not in params and not takes_kwargs:
                raise UsageError(f"{name!r} is not an argument of the model; arguments: {', '.join(params)}")
        self.mask_arg = mask_arg
        self._padding_checked = not check_padding
        from fullgraph.compile.compiled import CompiledModel  # here: compiled imports this module

        self._guard = None if isinstance(model, CompiledModel) else CallGuard()
        if self._guard is not None:
            self._guard.graph_trees = True

    @classmethod
    def from_range(cls, model: Callable, dim: int, size_range: Range, **kwargs: Any) -> "Bucketed":
        """Buckets covering a declared range: powers of two from the first one >= min, then max itself.

        ``(1, 32)`` gives (1, 2, 4, 8, 16, 32); ``(3, 50)`` gives (4, 8, 16, 32, 50): ending at max, not at the
        next power of two, since no size above max is declared and padding past it would be waste.
        """
        lo, hi = check_range(size_range, "Bucketed.from_range")
        if hi < 1:
            raise UsageError(f"Bucketed.from_range: max {hi} < 1; buckets are positive sizes")
        b = 1 << (max(lo, 1) - 1).bit_length()
        buckets = []
        while b < hi:
            buckets.append(b)
            b *= 2
        return cls(model, dim, (*buckets, hi), **kwargs)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, buckets={self.buckets}"

    def bucket_for(self, size: int) -> int:
        """The smallest bucket >= size; an error above the largest (see the class docstring for why)."""
        i = bisect.bisect_left(self.buckets, size)
        if i == len(self.buckets):
            raise UsageError(
                f"size {size} along dim {self.dim} is above the largest bucket {self.buckets[-1]}; "
                f"add a bucket >= {size} or split the request"
            )
        return self.buckets[i]

    def _carries_batch(self, path: str, v: object) -> bool:
        if not isinstance(v, torch.Tensor) or v.ndim <= self.dim:
            return False
        return self.batch_args is None or path in self.batch_args or _root(path) in self.batch_args

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._guard is None:
            return self._bucketed(args, kwargs)
        with self._guard:
            return copy_out(self._bucketed(args, kwargs))

    def _bucketed(self, args: tuple, kwargs: dict) -> Any:
        bound = _bind(self._sig, args, kwargs)
        named = _named(bound)
        leaves, _ = pytree.tree_flatten_with_path(named)
        first = next((v for kp, v in leaves if self._carries_batch(_render(kp), v)), None)
        if first is None:
            raise UsageError(f"Bucketed(dim={self.dim}): no batch-carrying tensor input has dim {self.dim}")
        n = first.shape[self.dim]
        bucket = self.bucket_for(n)
        if self.mask_arg is not None and named.get(self.mask_arg) is None:
            named[self.mask_arg] = torch.ones(first.shape[: self.dim + 1], dtype=torch.int64, device=first.device)
        leaves, treespec = pytree.tree_flatten_with_path(named)
        # Which leaves get padded, decided once: tensors of the true size along dim that carry the batch, and the mask.
        pad = [
            isinstance(v, torch.Tensor)
            and (_root(path) == self.mask_arg or self._carries_batch(path, v))
            and v.ndim > self.dim
            and v.shape[self.dim] == n
            for path, v in ((_render(kp), v) for kp, v in leaves)
        ]

        def padded(copy_real: bool) -> Any:
            new = [
                self._pad(v, n, bucket, mask=_root(_render(kp)) == self.mask_arg, copy_real=copy_real) if p else v
                for (kp, v), p in zip(leaves, pad, strict=True)
            ]
            return pytree.tree_unflatten(new, treespec)

        if n == bucket:
            return self._slice(_call(self.model, bound, named), n, bucket)
        out = _call(self.model, bound, padded(copy_real=False))
        if not self._padding_checked and n > 0:
            # Keep the first run's outputs: under CUDA graphs the second run reuses their memory.
            out = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
            self._compare(out, _call(self.model, bound, padded(copy_real=True)), n, bucket)
            self._padding_checked = True
        return self._slice(out, n, bucket)

    def _pad(self, v: torch.Tensor, n: int, bucket: int, *, mask: bool, copy_real: bool) -> torch.Tensor:
        shape = (*v.shape[: self.dim], bucket - n, *v.shape[self.dim + 1 :])
        if mask:
            fill = v.new_zeros(shape)
        elif copy_real:  # the check's other padding: the first real position, always a valid value (token ids too)
            fill = v.narrow(self.dim, 0, 1).expand(shape)
        else:
            fill = v.new_full(shape, self.pad_value)
        return torch.cat([v, fill], self.dim)

    def _sliced(self, out: Any, bucket: int) -> list[tuple[str, object, bool]]:
        """Each output leaf with its name and whether it is sliced; raises for a wanted one that cannot be."""
        leaves, _ = pytree.tree_flatten_with_path(out)
        named = [(_render(kp, "output"), v) for kp, v in leaves]
        if self.batch_outputs is not None and not self.batch_outputs <= {p for p, _ in named}:
            missing = sorted(self.batch_outputs - {p for p, _ in named})
            raise UsageError(
                f"batch_outputs names {missing[0]!r}, not an output; outputs: {', '.join(p for p, _ in named)}"
            )
        result = []
        for path, v in named:
            wanted = isinstance(v, torch.Tensor) and (self.batch_outputs is None or path in self.batch_outputs)
            if wanted and (v.ndim <= self.dim or v.shape[self.dim] != bucket):
                raise UsageError(
                    f"{path} has shape {tuple(v.shape)}, whose dim {self.dim} is not the padded size {bucket}, so "
                    f"Bucketed cannot slice it back (a reduction over dim {self.dim}?); return batch-aligned "
                    "outputs, or name the ones to slice with batch_outputs="
                )
            result.append((path, v, wanted))
        return result

    def _slice(self, out: Any, n: int, bucket: int) -> Any:
        _, treespec = pytree.tree_flatten(out)
        leaves = [v.narrow(self.dim, 0, n) if wanted else v for _, v, wanted in self._sliced(out, bucket)]
        return pytree.tree_unflatten(leaves, treespec)

    def _compare(self, out: Any, again: Any, n: int, bucket: int) -> None:
        for (path, a, wanted), b in zip(self._sliced(out, bucket), pytree.tree_leaves(again), strict=True):
            if not wanted:
                continue
            same, diff = _close(a.narrow(self.dim, 0, n), b.narrow(self.dim, 0, n))
            if not same:
                fix = "its mask_arg does not cover it" if self.mask_arg else "pass mask_arg= naming its padding mask"
                raise UsageError(
                    f"{path} changes with the padding values (max difference {diff:.3g}): the model mixes positions "
                    f"along dim {self.dim}, so padding would leak into results; {fix}, or do not bucket this dim"
                )
