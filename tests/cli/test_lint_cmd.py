"""`fullgraph lint`: text and JSON output, --select, exit codes 0/1/2, and the pre-commit hook definition."""

import json
import re
from pathlib import Path

import pytest

from fullgraph.cli.main import main
from fullgraph.diagnose.lint import lint_paths
from fullgraph.diagnose.rules import RULES

ROOT = Path(__file__).parents[2]
CASES = ROOT / "tests" / "diagnose" / "lint_cases"
BAD = CASES / "host_sync_bad.py"
GOOD = CASES / "host_sync_good.py"
LINE = re.compile(r"^(?P<path>.+):(?P<line>\d+):(?P<col>\d+): (?P<rule>FG\d{3}) .+ \(fix: .+\)$")


def test_clean_file_exits_0(capsys):
    assert main(["lint", str(GOOD)]) == 0
    assert capsys.readouterr().out == "no findings in 1 file\n"


def test_findings_exit_1_one_line_each_then_a_summary(capsys):
    assert main(["lint", str(BAD), str(GOOD)]) == 1
    *lines, summary = capsys.readouterr().out.splitlines()
    expected = lint_paths([BAD])
    assert len(lines) == len(expected) > 1
    for line, f in zip(lines, expected, strict=True):
        m = LINE.match(line)
        assert m, line
        assert (m["path"], int(m["line"]), int(m["col"]), m["rule"]) == (str(BAD), f.line, f.col, f.rule)
    assert summary == f"{len(expected)} findings in 1 of 2 files"


def test_json_is_a_list_of_findings(capsys):
    assert main(["lint", "--format", "json", str(BAD)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data == [vars(f) for f in lint_paths([BAD])]
    assert all(set(d) == {"path", "line", "col", "rule", "message", "fix"} for d in data)
    assert main(["lint", "--format", "json", str(GOOD)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_select_limits_the_report(capsys):
    bad = CASES / "print_logging_bad.py"
    assert main(["lint", "--select", "FG002,FG003", str(bad)]) == 0
    capsys.readouterr()
    assert main(["lint", "--select", "fg004", "--format", "json", str(bad), str(BAD)]) == 1
    assert {d["rule"] for d in json.loads(capsys.readouterr().out)} == {"FG004"}


def assert_exit_2_with_one_line(capsys, args, message):
    assert main(["lint", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("fullgraph lint: error: ") and message in line, line


def test_unknown_rule_exits_2(capsys):
    assert_exit_2_with_one_line(capsys, ["--select", "FG001,FG999", str(GOOD)], "unknown rule FG999")


def test_missing_path_exits_2(tmp_path, capsys):
    assert_exit_2_with_one_line(capsys, [str(GOOD), str(tmp_path / "missing.py")], "missing.py: no such file")


def test_unparseable_file_exits_2_naming_file_and_line(tmp_path, capsys):
    (tmp_path / "ok.py").write_text("x = 1\n")
    (tmp_path / "broken.py").write_text("import torch\n\ndef forward(self x):\n    return x\n")
    assert_exit_2_with_one_line(capsys, [str(tmp_path)], "broken.py:3: cannot parse: ")


def test_directory_argument_recurses(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.py").write_text(BAD.read_text())
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "skip.py").write_text(BAD.read_text())
    assert main(["lint", "--format", "json", str(tmp_path)]) == 1
    assert {Path(d["path"]).name for d in json.loads(capsys.readouterr().out)} == {"m.py"}


def test_help_lists_every_rule(capsys):
    with pytest.raises(SystemExit) as e:
        main(["lint", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(f"{r.id}  {r.name}" in out for r in RULES)


def test_pre_commit_hook_runs_fullgraph_lint_on_python_files():
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    fields = dict(re.findall(r"^-? *(\w+): (.+)$", text, flags=re.MULTILINE))
    assert fields["id"] == "fullgraph-lint"
    assert fields["entry"] == "fullgraph lint"
    assert fields["language"] == "python"
    assert fields["types"] == "[python]"
