"""`fullgraph tune`: a search that writes a result the other commands read, and a command line that cannot be used
refused in one line with exit 2 before anything is built."""

import argparse
import textwrap

import pytest

from fullgraph.cli.main import main
from fullgraph.cli.tune_cmd import _save_cache, cache_path
from fullgraph.compile.tuned import TuneResult
from fullgraph.deploy import read_cache
from tests.cli import last_error

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    from fullgraph import ops


    class Block(nn.Module):
        def __init__(self, dim=32):
            super().__init__()
            self.fc, self.norm = nn.Linear(dim, dim), ops.RMSNorm(dim)

        def forward(self, x):
            return self.norm(torch.relu(self.fc(x)))


    def block():
        return Block(), (torch.randn(4, 32),)
    """
)


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MODEL)
    return f"{path}:block"


def test_tune_writes_a_result_that_export_reads(target, tmp_path, capsys):
    out = tmp_path / "tuned.json"
    flags = ["--preset", "dev", "--mode", "none", "--ops", "none", "--budget", "120", "--reps", "6", "-o", str(out)]
    assert main(["tune", target, *flags]) == 0
    printed = capsys.readouterr().out
    r = TuneResult.load(out)
    names = [row["name"] for row in r.table]
    assert {"eager fp32", "compile dev fp32", "compile dev fp32 ops=native"} <= set(names)
    assert f"pick: {r.name}" in printed and "fullgraph.deploy.compile_tuned(model" in printed
    assert "*  " + r.name in printed  # the pick is marked in the table
    # export takes its dtype from the result: a contradicting --dtype is refused before anything is built
    assert main(["export", target, "--tuned", str(out), "--dtype", "fp16", "-o", str(tmp_path / "m.pt2")]) == 2
    assert "contradicts" in last_error(capsys, "export")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--preset", "fast"], "--preset: unknown fast; choose from dev"),
        (["--mode", "turbo"], "--mode: unknown turbo"),
        (["--ops", "+rms_nrom"], "--ops: unknown op(s) rms_nrom"),
        (["--ops", "rms_norm"], "cannot read 'rms_norm'"),
        (["--budget", "0"], "--budget must be a positive number"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
        (["--reps", "0"], "--reps must be at least 1"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(target, tmp_path, capsys, flags, expected):
    out = tmp_path / "tuned.json"
    assert main(["tune", target, "-o", str(out), *flags]) == 2
    assert expected in last_error(capsys, "tune")
    assert not out.exists()


def test_export_refuses_a_file_that_is_not_a_tune_result(target, tmp_path, capsys):
    bad = tmp_path / "report.json"
    bad.write_text('{"configs": []}')
    assert main(["export", target, "--tuned", str(bad), "-o", str(tmp_path / "m.pt2")]) == 2
    assert "is not a fullgraph tune result" in last_error(capsys, "export")


def test_cache_artifacts_of_the_pick_are_compiled_alone_and_saved_beside_the_json(target, tmp_path):
    out = str(tmp_path / "tuned.json")
    result = TuneResult(config="compile dev fp32", ops={"all": "native"})
    result.save(out)
    args = argparse.Namespace(output=out)
    line = _save_cache(args, target, ["4x32:fp32"], "cpu", result, say=lambda msg: None)
    meta, payload = read_cache(cache_path(out))
    assert (meta.preset, meta.signature) == ("dev", "4x32:float32@cpu")
    assert meta.artifacts and payload
    assert 'load_cache("' in line and 'preset="dev"' in line
    eager = TuneResult(config="eager fp32")
    assert "does not compile" in _save_cache(args, target, [], "cpu", eager, say=lambda msg: None)


@pytest.mark.parametrize("flags, expected", [([], None), (["--serial"], False)])
def test_serial_turns_the_background_compiles_off_and_the_default_leaves_them_to_the_device(
    target, tmp_path, monkeypatch, flags, expected
):
    import fullgraph.diagnose.tune as tune_mod

    seen = {}

    def fake_tune(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit(7)  # stop before anything compiles

    monkeypatch.setattr(tune_mod, "tune", fake_tune)
    with pytest.raises(SystemExit):
        main(["tune", target, "--preset", "dev", *flags, "-o", str(tmp_path / "t.json")])
    assert seen["ahead"] is expected
