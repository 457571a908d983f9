"""Benchmark suites: each module has `run(args) -> (rows, table)`; `fullgraph bench` declares their arguments."""
