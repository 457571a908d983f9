import json

import pytest
import torch

from fullgraph import env
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
    out = capsys.readouterr().out
    assert "measured copy bandwidth" in out
    # On a CPU the kernel ran in Triton's interpreter: flagged in the rows, the table and one warning line
    interpreted = {r.variant for r in rows if json.loads(r.params).get("interpreter")}
    assert interpreted == ({"kernel"} if triton_device == "cpu" else set())
    assert (out.count(suite.INTERPRETER_WARNING) == 1) == (triton_device == "cpu")
    assert (suite.INTERPRETER_NOTE in out) == (triton_device == "cpu")


def test_cpu_without_the_interpreter_skips_the_kernel_and_runs_the_rest(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    why = env.triton_runs_on("cpu")[1]  # "CPU tensors need TRITON_INTERPRET=1", or triton is not installed
    path = tmp_path / "ops.csv"
    args = ["bench", "ops", "--ops", "rms_norm", "--shapes", "8x64", "--reps", "2", "--device", "cpu"]
    assert main([*args, "--csv", str(path)]) == 0
    rows = read_csv(path)
    assert {r.variant for r in rows if r.metric == "tbps"} == {"eager native", "torch built-in", "compiled native"}
    (skipped,) = [r for r in rows if r.variant == "kernel"]
    assert skipped.metric == "skipped" and json.loads(skipped.params)["skip_reason"] == why
    out = capsys.readouterr().out
    assert f"skipped: {why}" in out and suite.INTERPRETER_WARNING not in out


def test_a_variant_that_fails_is_an_error_row_not_the_end(monkeypatch):
    def broken(*args):
        raise RuntimeError("no C++ compiler\nsecond line")

    monkeypatch.setattr(suite, "variants", lambda case: {"eager native": case.builtin, "compiled native": broken})
    case = suite.CASES["rms_norm"]
    rows, table = suite._run_case(case, 8, 64, torch.float32, torch.device("cpu"), False, 1.0, 2)
    assert [row[2] for row in table] == ["eager native", "compiled native"]
    assert table[0][3] > 0 and table[1][3] is None
    assert table[1][7] == "error: RuntimeError: no C++ compiler"
    errors = [r for r in rows if r.metric == "error"]
    assert len(errors) == 1 and errors[0].variant == "compiled native"


def test_nothing_to_run_is_an_error(monkeypatch, capsys):
    monkeypatch.setattr(suite, "unavailable", lambda variant, device: "not on this machine")
    args = ["bench", "ops", "--ops", "modulate", "--shapes", "8x64", "--reps", "2", "--device", "cpu"]
    assert main([*args, "--csv", "/dev/null"]) == 2
    assert "no variant of the ops suite could run on cpu: skipped: not on this machine" in capsys.readouterr().err


def test_every_case_reference_agrees_with_its_native_form():
    # The suite's own references (float64) must describe the same math as the ops: a wrong reference would
    # mark a correct kernel FAIL, or pass a wrong one.
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
