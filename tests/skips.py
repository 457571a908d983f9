"""The one place tests say what they need. Use these, never a hand-written skipif.

`gpu` is also a pytest marker: conftest skips every test marked `gpu` on a machine without CUDA, so
`pytest -m gpu` selects the GPU tests and a CPU run reports them as skipped.
"""

import pytest

from fullgraph import env

requires_cuda = pytest.mark.gpu
requires_triton = pytest.mark.skipif(not env.has_triton(), reason="needs triton (pip install 'fullgraph[triton]')")


def requires_sm(major: int, minor: int = 0):
    """Needs a CUDA GPU of compute capability >= major.minor (marks the test `gpu` too)."""
    cap = env.cuda_capability()
    too_old = cap is not None and cap < (major, minor)
    skip = pytest.mark.skipif(too_old, reason=f"needs compute capability >= {major}.{minor}, have {cap}")

    def apply(obj):
        return pytest.mark.gpu(skip(obj))

    return apply
