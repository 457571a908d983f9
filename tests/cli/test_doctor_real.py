"""`fullgraph doctor TARGET` on the real-model targets in tests/diagnose/targets/: a decorated function with a Python
float argument, a file importing its sibling, keyword inputs from specs and from the target itself."""

import os
import sys

import pytest
import torch

from fullgraph.cli.main import main
from fullgraph.diagnose.report import Report
from tests.diagnose.real_models import fresh_dynamo, line_of  # noqa: F401 (a fixture)
from tests.diagnose.targets import bert, exercise_2_5

TARGETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "diagnose", "targets")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def doctor(tmp_path, target: str, *args: str) -> tuple[int, Report | None]:
    out = tmp_path / "report.json"
    rc = main(["doctor", os.path.join(TARGETS, target), *args, "--json", str(out), "--html", str(tmp_path / "r.html")])
    return rc, Report.from_json(out.read_text()) if rc == 0 else None


def test_float_argument_target(tmp_path):
    """Exercise 2.5 through the CLI: `process(x, threshold)`, a `torch.compile`-decorated function, a float."""
    rc, report = doctor(tmp_path, "exercise_2_5.py:build", "--mode", "eager", "--reps", "3")
    assert rc == 0
    assert report.graph_break_count == 1
    (brk,) = report.graph_breaks
    assert os.path.samefile(brk.file, exercise_2_5.__file__)
    assert brk.line == line_of(exercise_2_5.__file__, "if scores.max() > threshold:") and brk.fix
    assert report.inputs[0] == "48x16:float32" and len(report.inputs) == 2
    assert report.configs[0].ok


def test_target_importing_its_sibling_loads(tmp_path):
    """sibling_target.py does `from sibling_parts import GatedBlock`: it imports only with its folder on sys.path,
    which the doctor adds while it imports the file, and takes away after."""
    sys.modules.pop("sibling_parts", None)  # imported here first, not left over from another test
    path_before = list(sys.path)
    rc, report = doctor(tmp_path, "sibling_target.py:build", "--mode", "eager", "--reps", "3")
    assert rc == 0
    assert sys.path == path_before
    assert sys.modules["sibling_parts"].__file__ == os.path.join(TARGETS, "sibling_parts.py")
    assert report.graph_break_count == 0 and report.inputs == ["3x24:float32"]
    assert report.configs[0].ok and report.configs[0].median_ms > 0


def test_keyword_inputs_from_specs(tmp_path):
    """A transformers model built by the target, its inputs from specs: one positional, one by keyword."""
    rc, report = doctor(
        tmp_path, "bert.py:model", "--input", "2x16:int64", "--input", "attention_mask=2x16:int64",
        "--mode", "eager", "--reps", "3",
    )  # fmt: skip
    assert rc == 0
    assert report.inputs == ["2x16:int64", "attention_mask=2x16:int64"]
    with torch.no_grad():
        kwargs = bert.inputs()
        count = torch._dynamo.explain(bert.model())(kwargs["input_ids"], attention_mask=kwargs["attention_mask"])
    assert report.graph_break_count == count.graph_break_count
    assert report.configs[0].error is None


def test_target_returning_module_args_and_kwargs(tmp_path):
    rc, report = doctor(tmp_path, "bert.py:with_inputs", "--mode", "eager", "--reps", "3")
    assert rc == 0
    assert report.inputs == ["input_ids=2x16:int64", "attention_mask=2x16:int64"]
    assert report.configs[0].ok


def test_input_the_function_does_not_take_is_one_line_exit_2(tmp_path, capsys):
    rc, _ = doctor(tmp_path, "exercise_2_5.py:build", "--input", "4x16:fp32", "--input", "scale=1:fp32")
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error" in err[-1] and "scale" in err[-1] and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "report.json").exists()
