"""Benchmark suites. Each module has `add_arguments(parser)` and `run(args) -> (rows, table)`."""

# suite name -> (module, one-line description)
SUITES = {
    "ceilings": ("fullgraph.bench.suites.ceilings", "copy bandwidth (TB/s) and GEMM rate (TFLOP/s) of this device"),
    "ops": ("fullgraph.bench.suites.ops", "norms, RoPE and modulation: eager, built-in, compiled and kernel, in TB/s"),
}
