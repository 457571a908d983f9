"""Benchmark suites: each module has `run(args) -> (rows, table)`; `fullgraph bench` declares their arguments."""

import contextlib
import functools

import torch

from fullgraph.errors import UsageError

# functions, not `fullgraph.ops` itself: the name `ops` here is the ops suite's submodule (fullgraph.bench.suites.ops)
from fullgraph.ops.policies import check_spec, parse_spec, policy, snapshot

# --dtype names shared by the suites
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_sizes(flag: str, spec: str, example: str) -> tuple[int, ...]:
    """`--seqs 197,1024`-style lists of positive ints; anything else is one error naming the flag and an example."""
    try:
        sizes = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UsageError(f"{flag}: cannot read {spec!r}; write {example}")
    return sizes


TOP_KERNELS = 8  # kernels listed under each profiled row (--breakdown)


def top_kernel_lines(breakdown, indent: str = "      ") -> list[str]:
    """The kernels behind a profiled breakdown's classes, slowest first (what a change would aim at): one line each,
    "gemm 0.1731 x22 nvjet_... (aten::addmm)"."""
    lines = []
    for k in breakdown.top[:TOP_KERNELS]:
        where = f" ({k.source[:40]})" if k.source else ""
        lines.append(f"{indent}{k.cls} {k.ms:.4f} x{k.calls} {k.name[:56]}{where}")
    return lines


def extra_policies(spec: str | None) -> dict[str, str]:
    """--policies "spec;spec" -> {label: spec}, each spec checked now (FULLGRAPH_OPS syntax, known ops only)."""
    out = {}
    for item in (s.strip() for s in (spec or "").split(";")):
        if item:
            check_spec(item)
            out[item] = item
    return out


@functools.cache
def _parsed(spec: str) -> dict:
    return parse_spec(spec)


def policy_context(spec: str | None):
    """The op-policy context a variant's calls run in: none for no spec, and none for "all=auto" while no policy is
    set (what a user who sets none runs; the context's ~10 us of host time per call is the bench's, not the
    model's)."""
    if not spec or (spec == "all=auto" and not snapshot()):
        return contextlib.nullcontext()
    return policy(**_parsed(spec))
