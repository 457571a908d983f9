"""benchmarks/dit_kernels.py on the CPU: a sweep point by --shape (batch, tokens and the stack's dim and heads reach
the models), each variant's launches per call, the kernels ordered by their spread, and a bad --shape refused."""

import re
import sys

import pytest

from tests.bench.scripts import load_script


@pytest.fixture(scope="module")
def dk():
    return load_script("dit_kernels")


def test_twins_take_the_sweep_points_shape_and_share_weights(dk):
    ours, plain, x, c = dk.twins(24, "cpu", 3, dim=64, heads=2, depth=4)
    assert tuple(x.shape) == (3, 24, 64) and tuple(c.shape) == (3, 64)
    assert len(ours.blocks) == 4 and ours.cfg.heads == 2
    theirs = plain.state_dict()
    assert all((v == theirs[k]).all() for k, v in ours.state_dict().items())


def test_a_shape_prints_both_variants_launches_and_the_kernels_by_spread(dk, monkeypatch, capsys):
    argv = ["dit_kernels.py", "--shape", "64x2:2:16", "--variants", "plain,native", "--by", "diff", "--top", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    assert dk.main() == 0
    out = capsys.readouterr().out
    assert out.startswith("# 64x2:2:16, mode default, cpu")
    launches = dict(re.findall(r"^(plain|native) +median [\d.]+ ms; kernel time [\d.]+ ms; (\d+) launches", out, re.M))
    assert set(launches) == {"plain", "native"} and all(int(n) > 0 for n in launches.values())
    lines = out.splitlines()
    rows = [
        line for line in lines[next(i for i, t in enumerate(lines) if t.startswith("kernel ")) + 1 :] if line.strip()
    ]
    spreads = [abs(float(a) - float(b)) for a, b in (re.findall(r"([\d.]+) \( *\d+\)", r)[:2] for r in rows)]
    assert len(spreads) == 4 and spreads == sorted(spreads, reverse=True)


def test_a_bad_shape_is_refused_with_the_form(dk, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dit_kernels.py", "--shape", "64x2"])
    with pytest.raises(SystemExit) as e:
        dk.main()
    assert e.value.code == 2 and "write DIMxHEADS:BATCH:TOKENS" in capsys.readouterr().err


def test_a_one_kernel_variant_runs_all_native_but_the_ops_it_names(dk, monkeypatch, capsys):
    assert dk.variant_policy("native+layer_norm_modulate+qk_norm_rope") == {
        "all": "native", "layer_norm_modulate": "kernel", "qk_norm_rope": "kernel"
    }  # fmt: skip
    assert dk.variant_policy("plain") is None and dk.variant_policy("auto") == {"all": "auto"}
    monkeypatch.setattr(sys, "argv", ["dit_kernels.py", "--small", "--variants", "plain,native+no_such_op"])
    with pytest.raises(SystemExit) as e:
        dk.main()
    assert e.value.code == 2 and "unknown variant(s) ['native+no_such_op']" in capsys.readouterr().err
