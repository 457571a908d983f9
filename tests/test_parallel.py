"""The test suite's own parallel run (pytest-xdist, `-n auto` in the README's quick start): tests marked
`exclusive` run while no other test runs (tests/conftest.py)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TESTS = """
import json, time
import pytest

def record(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open({log!r}, "a") as f:
        f.write(json.dumps([name, start, time.monotonic()]) + "\\n")

@pytest.mark.parametrize("n", range(8))
def test_plain(n):
    record(f"plain{{n}}", 0.3)

@pytest.mark.exclusive
@pytest.mark.parametrize("n", range(2))
def test_alone(n):
    record(f"alone{{n}}", 0.5)
"""


@pytest.mark.slow
def test_an_exclusive_test_runs_while_no_other_test_runs(tmp_path):
    pytest.importorskip("xdist")
    log, before = tmp_path / "log.jsonl", lock_files()
    (tmp_path / "test_mixed.py").write_text(TESTS.format(log=str(log)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
         str(tmp_path / "test_mixed.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(spans) == 10
    plain = [s for s in spans if s[0].startswith("plain")]
    overlapping = [(a[0], b[0]) for a in spans if a[0].startswith("alone") for b in spans
                   if b is not a and b[1] < a[2] and a[1] < b[2]]  # fmt: skip
    assert overlapping == []
    # the plain tests did run side by side: the locks serialise the exclusive tests only
    assert any(b[1] < a[2] and a[1] < b[2] for a in plain for b in plain if a is not b)
    assert lock_files() == before  # the workers removed theirs


def lock_files() -> set[Path]:
    """The run lock files in the temporary folder, less this run's own: under an outer `-n` run, another worker's
    first test makes them while the inner run goes on."""
    outer = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    found = Path(tempfile.gettempdir()).glob("fullgraph-pytest-*.lock")
    return {p for p in found if outer is None or f"-{outer}-" not in p.name}
