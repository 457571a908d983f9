import csv
import json
import random

import pytest
import torch

from fullgraph.bench import results
from fullgraph.errors import UsageError
from fullgraph.timing import Measurement, Timing


def random_rows(n):
    rows = []
    for i in range(n):
        value = random.choice([random.uniform(-1e-9, 1e-9), random.uniform(0, 1e12), float(random.randint(0, 99))])
        rows += results.make_rows(
            "ops", f"case {i}, with a comma", random.choice(["eager", "kernel"]), {"median_ms": (value, "ms")},
            {"shape": [random.randint(1, 9), 7], "dtype": "bf16"},
        )  # fmt: skip
    return rows


def test_csv_round_trips(tmp_path):
    path = tmp_path / "sub" / "r.csv"
    first, second = random_rows(5), random_rows(3)
    assert results.append_csv(path, first) == 5
    results.append_csv(path, second)
    back = results.read_csv(path)
    assert back == first + second  # values written with repr() come back bit-exact
    with open(path) as f:
        assert next(csv.reader(f)) == list(results.COLUMNS)


def test_rows_carry_tags():
    (row,) = results.make_rows("s", "c", "v", {"m": (1.5, "ms")}, {"b": 2, "a": 1})
    assert row.torch == torch.__version__ and row.fullgraph
    assert row.device in ("cpu", "cuda") and row.date.endswith("+00:00")
    assert json.loads(row.params) == {"a": 1, "b": 2} and row.params.startswith('{"a"')


def test_measurement_rows_keep_first_call_apart():
    t = Timing.from_samples([1.0, 2.0, 3.0], inner=1, method="cpu-clock")
    metrics = results.measurement_metrics(Measurement(first_call_s=4.0, timing=t, peak_memory_bytes=None))
    assert metrics["first_call_s"] == (4.0, "s") and metrics["median_ms"] == (2.0, "ms")
    assert "peak_memory_bytes" not in metrics


def test_foreign_csv_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="other columns"):
        results.append_csv(path, random_rows(1))
    with pytest.raises(UsageError, match="not a fullgraph results file"):
        results.read_csv(path)


def test_appending_no_rows_makes_no_file(tmp_path):
    path = tmp_path / "none.csv"
    assert results.append_csv(path, []) == 0 and not path.exists()
    results.append_csv(path, random_rows(2))
    before = path.read_text()
    assert results.append_csv(path, iter(())) == 0 and path.read_text() == before
