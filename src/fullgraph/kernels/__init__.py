"""Raw Triton kernels, one file per op, each registered as a real torch op `fullgraph::<name>`.

Every file has the same tiers: `_<op>_fwd_kernel` (the `@triton.jit`, built lazily), `<op>_fwd` (checks,
grid and launch), and the op registered through `kernel_op`. Importing needs neither Triton nor a GPU;
calling a kernel that cannot run raises a `FullgraphError` that says why.
"""
