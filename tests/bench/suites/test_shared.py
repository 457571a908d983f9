"""Helpers the suites share (fullgraph.bench.suites)."""

from types import SimpleNamespace

from fullgraph.bench.breakdown import KernelTime
from fullgraph.bench.suites import TOP_KERNELS, top_kernel_lines


def test_top_kernel_lines_list_the_slowest_kernels_with_their_source_capped():
    top = [KernelTime(f"kernel_{i}", "gemm" if i % 2 else "elementwise", 1.0 / (i + 1), i + 1,
                      "aten::addmm" if i % 2 else "") for i in range(TOP_KERNELS + 3)]  # fmt: skip
    lines = top_kernel_lines(SimpleNamespace(top=top), indent="  ")
    assert len(lines) == TOP_KERNELS
    assert lines[0] == "  elementwise 1.0000 x1 kernel_0"
    assert lines[1] == "  gemm 0.5000 x2 kernel_1 (aten::addmm)"
    long = KernelTime("n" * 80, "gemm", 0.25, 3, "s" * 60)
    (line,) = top_kernel_lines(SimpleNamespace(top=[long]))
    assert line == "      gemm 0.2500 x3 " + "n" * 56 + " (" + "s" * 40 + ")"
