"""`fullgraph export` and `fullgraph load`: a command line that cannot be used is one line and exit 2 before anything
is built; work that fails is one line and exit 1; a good export is loaded, checked against eager and runs in a
fresh process that never imports the model's code."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from fullgraph.cli.export_cmd import recorded_specs
from fullgraph.cli.main import main
from fullgraph.errors import UsageError
from tests.cli import last_error

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    from fullgraph import ops


    class Block(nn.Module):
        def __init__(self, dim=32):
            super().__init__()
            self.ln, self.ada = ops.LayerNorm(dim), nn.Linear(dim, 2 * dim)
            self.fc, self.norm = nn.Linear(dim, dim), ops.RMSNorm(dim)

        def forward(self, x, c):
            shift, scale = self.ada(c).chunk(2, dim=-1)
            h = ops.modulate(self.ln(x), shift[:, None], scale[:, None])
            return self.norm(self.fc(h), residual=x)[0]


    def block():
        return Block(), (torch.randn(2, 5, 32), torch.randn(2, 32))


    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1


    def branchy():
        return Branchy(), (torch.randn(3, 4),)
    """
)


@pytest.fixture
def target(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path / "fullgraph-cache"))  # probe verdicts, not the user's
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")  # what the commands set, restored after the test
    path = tmp_path / "m.py"
    path.write_text(MODEL)
    return str(path)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--dynamic", '{"x": {"1": [8, 2]}}'], "min 8 > max 2"),
        (["--dynamic", "true"], "export declares dims with ranges"),
        (["--dynamic", '{"x": {"1": [1, 8]'], "--dynamic: not JSON"),
        (["--dynamic", '{"y": {"0": [1, 8]}}'], "'y', which is not an input; inputs: x, c"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
        (["--ops", "+rms_nrom"], "unknown op(s) rms_nrom"),
        (["--ops", "rms_norm"], "cannot read 'rms_norm'"),
        (["--preset", "egde"], "unknown preset 'egde'"),
        (["--input", "2x5xZ"], "does not parse"),
        (["--input", "c=2x32"], "the inputs given by name (c) must be the ones after the 0 given by position (x)"),
    ],
)
def test_export_bad_input_is_one_line_and_exit_2_before_anything_is_built(target, tmp_path, capsys, flags, expected):
    out = tmp_path / "m.pt2"
    assert main(["export", f"{target}:block", "-o", str(out), *flags]) == 2
    assert expected in last_error(capsys, "export")
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_refuses_a_name_torch_cannot_load(target, tmp_path, capsys):
    assert main(["export", f"{target}:block", "-o", str(tmp_path / "m.zip")]) == 2
    assert "ends in .pt2" in last_error(capsys, "export")


def test_export_of_data_dependent_control_flow_fails_with_exit_1_naming_the_line(target, tmp_path, capsys):
    assert main(["export", f"{target}:branchy", "-o", str(tmp_path / "b.pt2")]) == 1
    msg = last_error(capsys, "export")
    assert "torch.export could not capture Branchy at " in msg and "(`return x * 2 if x.sum() > 0 else x - 1`)" in msg
    assert "fullgraph doctor" in msg
    assert not (tmp_path / "b.pt2").exists()


def test_load_errors(target, tmp_path, capsys):
    assert main(["load", str(tmp_path / "none.pt2")]) == 2  # the command line names no file: usage
    assert "none.pt2 does not exist" in last_error(capsys, "load")
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"PK\x03\x04 cut short")
    junk.chmod(0o644)
    assert main(["load", str(junk)]) == 1  # the file is there but unusable: a runtime failure
    assert "junk.pt2 is not a readable package" in last_error(capsys, "load")
    assert main(["load", str(junk), "--reps", "0"]) == 2
    assert "--reps must be at least 1" in last_error(capsys, "load")


class Recorded:
    """What recorded_specs reads of a loaded package: its recorded inputs and metadata."""

    def __init__(self, inputs, int_values=None):
        self.inputs = inputs
        self.metadata = {"fullgraph_int_values": json.dumps(int_values)} if int_values is not None else {}


def test_recorded_specs_rebuild_the_example_inputs_or_ask_for_them():
    got = recorded_specs(Recorded("2x5x32:float32@cpu, 2x32:bfloat16@cuda"), "m.pt2")
    assert got == ["2x5x32:float32", "2x32:bfloat16"]
    ids = Recorded("2x16:int64@cpu, 2x16:int64@cpu, 2x4:float32@cpu", {"0": [3, 997], "1": [0, 1]})
    assert recorded_specs(ids, "m.pt2") == ["2x16:int64:3-997", "2x16:int64:0-1", "2x4:float32"]
    for signature in ("4x8:float32@cpu, 7", ":float32@cpu", None):
        with pytest.raises(UsageError, match="--input"):
            recorded_specs(Recorded(signature), "m.pt2")


@pytest.mark.slow
def test_inputs_given_in_the_dtype_the_model_is_cast_to_are_taken(target, tmp_path, capsys):
    # `--input ...:bf16 --dtype bf16`: the eager reference runs the model as built (fp32 inputs), not bf16 inputs
    # into fp32 weights, which failed as "the model fails in eager mode" (timm ViT-B/16 on the H200)
    package = tmp_path / "block16.pt2"
    flags = ["--ops", "none", "--dtype", "bf16", "--no-check", "--input", "2x5x32:bf16", "--input", "2x32:bf16"]
    assert main(["export", f"{target}:block", "-o", str(package), *flags]) == 0
    assert "inputs 2x5x32:bfloat16, 2x32:bfloat16" in capsys.readouterr().out


def test_export_checks_the_package_and_load_runs_it_in_a_fresh_process(target, tmp_path, capsys):
    package = tmp_path / "block.pt2"
    flags = ["--ops", "none", "--dynamic", '{"x": {"1": [1, 64]}}']  # native forms: no Triton needed to run it
    flags += ["--input", "2x5x32", "--input", "c=2x32"]  # c by name, as a keyword-calling user gives it
    assert main(["export", f"{target}:block", "-o", str(package), *flags]) == 0
    out = capsys.readouterr().out
    assert re.search(r"in [\d.]+ s; inputs 2x5x32:float32, c=2x32:float32, dynamic", out)
    assert "custom ops it calls through Python: none" in out
    assert re.search(r"loaded in [\d.]+ s \(of which [\d.]+ s loading it first in a probe process\)", out)
    assert float(re.search(r"error against eager fp32: (\S+)", out).group(1)) < 1e-5

    # A fresh process in another folder, without the interpreter: it cannot import m.py and never tries.
    child_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = [sys.executable, "-m", "fullgraph", "load", str(package), "--input", "2x9x32", "--input", "c=2x32"]
    done = subprocess.run(run, capture_output=True, text=True, env=child_env, cwd=tmp_path / "..", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"loaded \S*block\.pt2 in [\d.]+ s \(probe verdict cached", done.stdout)
    # a CPU package: load's defaults keep torch's loader and one instance, and the command says so
    assert "runs 1 model instance, through torch's loader (the GIL held)" in done.stdout
    assert re.search(r"first call [\d.]+ ms, then [\d.]+ ms \(median of 20\)", done.stdout)
    assert "output 2x9x32:float32@cpu" in done.stdout  # the declared dim, at a size it was not exported with

    # Without --input: random inputs of the recorded shapes. Inputs that do not fit: usage, exit 2.
    assert main(["load", str(package), "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert "inputs 2x5x32:float32, 2x32:float32 (shaped as exported" in out and "output 2x5x32:float32@cpu" in out
    assert main(["load", str(package), "--input", "3x5x32", "--input", "2x32"]) == 2
    msg = last_error(capsys, "load")
    assert "do not fit" in msg and "input_handles[0]: unmatched dim value at 0, expected: 2, but got: 3" in msg
    assert main(["load", str(package), "--input", "2x65x32", "--input", "2x32"]) == 2
    assert "expected to be <= 64, but got: 65" in last_error(capsys, "load")


def test_load_with_inputs_that_do_not_fit_is_exit_2_whatever_words_the_runtime_uses(
    target, tmp_path, capsys, monkeypatch
):
    # On the H200 the runtime refuses them with a generic `run_func_(container_handle_, ...)` error: the inputs the
    # package records tell what happened. The package here is a stand-in that fails as that runtime does.
    from fullgraph.deploy import package
    from tests.deploy.test_package import RUN_FUNC, fake_package, probe_with, raising

    meta = {"fullgraph_inputs": "4x8:float32@cpu", "fullgraph_dynamic": "{}", "fullgraph_flat_dynamic": "{}"}
    path = fake_package(tmp_path / "mlp.pt2", **meta)
    probe_with(monkeypatch, "pass")
    monkeypatch.setattr(package, "open_package", lambda *args, **kwargs: raising(RuntimeError(RUN_FUNC)))
    assert main(["load", str(path), "--input", "8x8"]) == 2
    msg = last_error(capsys, "load")
    assert "these inputs (8x8:float32@cpu) do not fit" in msg and "(dim 0 of input 0 is 8, exported fixed at 4)" in msg
    assert "exported for 4x8:float32@cpu, every dim fixed" in msg and "run_func_" not in msg
    assert main(["load", str(path), "--input", "4x8"]) == 1  # inputs that fit: the failure is the work's, exit 1
    assert re.search(
        r"mlp\.pt2 loaded but failed on inputs 4x8:float32\S*: RuntimeError: run_func_", last_error(capsys, "load")
    )
