import os
import subprocess
import sys
from pathlib import Path

import pytest

from fullgraph import env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not env.has_triton(), reason="needs triton")
def test_every_kernel_builds_with_inductors_argument_types():
    """Inside torch.compile, Inductor launches our kernels with floats as fp64 and ints equal to 1 as constants;
    each kernel (every flash-attention variant included) must still build, through the whole compilation for
    Hopper (Triton's warp specialization pass failed on a two-loop kernel that built its IR fine). A
    subprocess, because the interpreter this test session runs under replaces triton.jit."""
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "tests.kernels.ttir_check"], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and lines, run.stdout + run.stderr
    assert all(line.startswith("ok ") for line in lines), run.stdout
    expected = {
        "ok rms_norm",
        "ok qk_norm_rope",
        "ok layer_norm_modulate_residual",
        "ok layer_norm_modulate_residual two branches 1408",
        "ok layer_norm_modulate_residual_y 1408",
        "ok flash_attention tma=1 ws=1 causal=1",
        "ok flash_attention ws_tile",
    }
    if env.triton_at_least(3, 6):
        expected |= {"ok flash_attention gluon 128/2 causal=0", "ok flash_attention gluon 128/2 causal=1"}
    assert expected <= set(lines), run.stdout
