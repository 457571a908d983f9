import pytest

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import ops as suite
from fullgraph.cli.main import main
from fullgraph.errors import UsageError


def test_suite_times_every_variant_and_checks_numerics(triton_device, tmp_path, capsys):
    path, md = tmp_path / "ops.csv", tmp_path / "ops.md"
    args = ["bench", "ops", "--ops", "rms_norm,modulate", "--shapes", "8x64", "--reps", "2", "--device", triton_device]
    assert main([*args, "--csv", str(path), "--markdown", str(md)]) == 0
    rows = read_csv(path)
    variants = {(r.case, r.variant) for r in rows if r.metric == "tbps"}
    assert variants == {
        ("rms_norm 8x64", "eager native"),
        ("rms_norm 8x64", "torch built-in"),
        ("rms_norm 8x64", "compiled native"),
        ("rms_norm 8x64", "kernel"),
        ("modulate 8x64", "eager native"),
        ("modulate 8x64", "compiled native"),
        ("modulate 8x64", "kernel"),
    }
    errors = [r.value for r in rows if r.metric == "rel_err"]
    assert len(errors) == 7 and all(0 <= e < 1e-2 for e in errors)  # bf16 against float64
    assert "| rms_norm | 8x64 | kernel |" in md.read_text()
    assert "measured copy bandwidth" in capsys.readouterr().out


def test_every_case_reference_agrees_with_its_native_form():
    # The suite's own references (float64) must describe the same math as the ops: a wrong reference would
    # mark a correct kernel FAIL, or pass a wrong one.
    import torch

    for name, case in suite.CASES.items():
        args = case.make(16, 256, torch.float32, torch.device("cpu"))
        with suite.ops.policy(**{suite._policy_of(name): "native"}):
            out = suite._first(case.call(*args))
        ref = case.ref(*args)
        assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5, name


@pytest.mark.parametrize("spec", ["16x", "axb", "0x8", "", "4x4x4"])
def test_bad_shapes(spec):
    with pytest.raises(UsageError, match="--shapes"):
        suite.parse_shapes(spec)


def test_unknown_op_is_a_one_line_error(capsys):
    assert main(["bench", "ops", "--ops", "rms_norm,softmax", "--device", "cpu", "--csv", "/dev/null"]) == 2
    assert "unknown op(s) softmax" in capsys.readouterr().err
