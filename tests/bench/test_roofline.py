import random

import pytest
import torch

from fullgraph.bench import roofline
from fullgraph.errors import UsageError


def test_rates_invert_to_their_inputs():
    nbytes, flops, ms = random.uniform(1e6, 1e10), random.uniform(1e9, 1e14), random.uniform(0.01, 100)
    assert roofline.tbps(nbytes, ms) * 1e12 * ms * 1e-3 == pytest.approx(nbytes)
    assert roofline.tflops(flops, ms) * 1e12 * ms * 1e-3 == pytest.approx(flops)


def test_pct_of():
    ceiling = random.uniform(1, 10)
    assert roofline.pct_of(ceiling * 0.9, ceiling) == pytest.approx(90.0)


@pytest.mark.parametrize("bad_ms", [0.0, -1.0, float("nan")])
def test_nonpositive_time_is_an_error(bad_ms):
    with pytest.raises(UsageError):
        roofline.tbps(1.0, bad_ms)


def test_tensor_bytes_counts_elements_times_size():
    a = torch.randn(random.randint(1, 50), 7, dtype=torch.bfloat16)
    b = torch.randn(13, dtype=torch.float32)
    assert roofline.tensor_bytes(a, b) == a.numel() * 2 + 13 * 4


def test_flop_counts():
    m, n, k = (random.randint(1, 100) for _ in range(3))
    a, b = torch.randn(m, k, dtype=torch.float64), torch.randn(k, n, dtype=torch.float64)
    assert roofline.gemm_flops(m, n, k) == 2 * (a @ b).numel() * k
    full = roofline.attention_flops(2, 3, 5, 7, 11)
    assert full == roofline.gemm_flops(5, 7, 11) * 2 * 6
    assert roofline.attention_flops(2, 3, 5, 7, 11, causal=True) == full / 2
