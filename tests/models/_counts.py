"""What the model tests share: the op-policy counts a call adds, and what Inductor's code for a model launches and
stores."""

import re

import torch
from torch._inductor.utils import run_and_get_code

from fullgraph import ops


def policy_counts(run):
    """run() and the op-policy counts it added: {(op, "eager" | "compiled", impl): n}."""
    before = dict(ops.counters)
    out = run()
    return out, {k: v - before.get(k, 0) for k, v in ops.counters.items() if v != before.get(k, 0)}


def inductor_code(model, *inputs) -> str:
    """The code Inductor writes for `model` compiled whole (Dynamo reset first) and called once without grad."""
    torch._dynamo.reset()
    with torch.no_grad():
        _, (code,) = run_and_get_code(torch.compile(model, fullgraph=True), *inputs)
    return code


def inductor_buffers(model, *inputs) -> tuple[int, list[tuple[str, str]]]:
    """(the number of fused kernels, the sorted (shape, dtype) of every buffer) in the code Inductor writes for
    `model` on the CPU: what a compiled call launches and stores."""
    code = inductor_code(model, *inputs)
    kernels = re.findall(r"^(cpp_fused_\w+) = ", code, re.M)
    buffers = re.findall(r"empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)", code)
    return len(kernels), sorted(buffers)


def inductor_kernels(model, *inputs) -> dict[str, str]:
    """{name: C++ source} of every fused kernel in the code Inductor writes for `model` on the CPU."""
    code = inductor_code(model, *inputs)
    return dict(re.findall(r"^(cpp_fused_\w+) = async_compile\.cpp_pybinding\(.*?'''(.*?)'''", code, re.M | re.S))


def inductor_calls(model, *inputs) -> list[str]:
    """The lines of the code Inductor writes for `model` on the CPU that call an aten op or an extern kernel (each
    with its arguments, comments left out): what a compiled call runs beside its fused kernels."""
    code = inductor_code(model, *inputs)
    return [ln.strip() for ln in code.splitlines()
            if not ln.strip().startswith("#") and re.search(r"= (torch\.ops\.|extern_kernels\.)", ln)]  # fmt: skip


def buffer_bytes(buffers: list[tuple[str, str]]) -> int:
    """The bytes `inductor_buffers`' buffers hold together."""
    size = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}
    total = 0
    for shape, dtype in buffers:
        n = 1
        for d in (x for x in shape.replace(" ", "").split(",") if x):
            n *= int(d)
        total += n * size.get(dtype, 4)
    return total
