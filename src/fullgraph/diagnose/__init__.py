"""Diagnosis: static lint of forward code, graph breaks, recompiles, CUDA-graph skips, and the doctor report."""
