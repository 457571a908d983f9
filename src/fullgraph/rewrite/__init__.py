"""Graph rewrites for models we did not write (DESIGN.md, Layers: above ops and kernels; `fullgraph.compile` reaches
them by name through `fullgraph.compile.rewrites.REGISTRY`, importing a module here only when a compile uses it).

Each module defines one `Rewrite` as `REWRITE`: `patch` (a convolution whose stride is its kernel: a GEMM), `gelu`
(a linear layer followed by GELU: one GEMM with the activation as its epilogue). What each matches, when `auto`
applies it, and what it does to results: docs/rewrites.md.
"""
