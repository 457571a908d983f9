import argparse
import json
import re

import pytest

from fullgraph.bench.suites import fleet
from tests.redis_server import redis_fixture  # noqa: F401  (the fixture `redis`)


def _args(**kw):
    base = {"device": "cpu", "reps": 1, "model": "vit_mini", "batch": 1, "dtype": None, "preset": None, "depth": 1,
            "routes": None, "timeout": 300.0, "replicas": 2, "variants": "sequential", "remote": None}  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_url_carries_password_and_database():
    assert fleet._url("redis://127.0.0.1:6379/0", "pw", 1) == "redis://:pw@127.0.0.1:6379/1"
    assert fleet._url("rediss://:pw@cache:6380/0", None, 0) == "rediss://:pw@cache:6380/0"


def test_arguments_are_checked():
    with pytest.raises(Exception, match="--replicas at least 2"):
        fleet.run(_args(replicas=1), fleet.Sources(None, print))


@pytest.mark.slow
def test_later_replicas_have_no_remote_fx_graph_misses_and_published_replicas_compile_nothing(redis):
    """Fresh processes with empty local caches (a CPU compile of a 1-block ViT is ~15-40 s each on 2 cores): the
    second sequential replica's FX graph comes from Redis; after one process published the precompiled code, each
    published replica runs it (no frame compiled: no FX-graph lookup at all) and matches eager fp32."""
    url = f"redis://:{redis.password}@127.0.0.1:{redis.port}/0"
    said: list[str] = []
    rows, table, failure = fleet.run(_args(remote=url, variants="sequential,published"),
                                     fleet.Sources(None, said.append))  # fmt: skip
    assert failure is None, table
    # each replica's figures as it finished, before the table (a run cut short keeps them)
    line = next(m for m in said if m.startswith("sequential-2: first_output_s"))
    assert re.match(
        r"sequential-2: first_output_s [\d.]+, median_ms [\d.]+, \d+ modules imported in the window, "
        r"FX hit/miss 1/0, remote",
        line,
    ), line
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("sequential-2", "fxgraph_cache_hit")] == 1 and value[("sequential-2", "fxgraph_cache_miss")] == 0
    assert value[("sequential-2", "remote_miss")] == 0 and value[("sequential-2", "remote_refused")] == 0
    assert value[("sequential-1", "remote_put")] >= 1 and value[("sequential-2", "rel_err")] < 1e-4
    how = {r.variant: json.loads(r.params).get("how") for r in rows if r.metric == "ok"}
    assert how["published-1"] == how["published-2"] == "published precompiled code"
    for name in ("published-1", "published-2"):
        assert value[(name, "fxgraph_cache_hit")] == value[(name, "fxgraph_cache_miss")] == 0
        assert value[(name, "rel_err")] < 1e-4
        # the bootstrap imported fullgraph's and Inductor's compilers before the window (before it did, a published
        # replica's window first imported ~625 modules on the CPU, a cold one's ~914); now what remains is the
        # loaded code's own and, on the CPU, the C++ build's
        assert value[(name, "window_imports")] < 300
    # no cold variant: the first sequential replica, which compiled, is the baseline for the ratios
    assert value[("sequential-2", "first_output_x_cold")] == pytest.approx(
        value[("sequential-2", "first_output_s")] / value[("sequential-1", "first_output_s")]
    )
    assert "published precompiled code" in table and "published-0" in table


def test_a_replica_is_summed_up_in_one_line():
    child = {"first_output_s": 1.5, "median_ms": 0.77, "counters": {}, "how": "published precompiled code",
             "window_imports": 31}  # fmt: skip
    ok = {"name": "published-1", "ok": True, "error": None, "remote": {"hit": 1, "miss": 2}, "child": child}
    assert fleet.summary(ok) == (
        "published-1: first_output_s 1.500, median_ms 0.770, 31 modules imported in the window, FX hit/miss 0/0, "
        "remote hit/miss/refused 1/2/0 (published precompiled code)"
    )
    failed = {"name": "cold-2", "ok": False, "error": "exit 1: RuntimeError: boom", "remote": {}, "child": {}}
    assert fleet.summary(failed) == "cold-2: exit 1: RuntimeError: boom"


def test_the_cold_median_is_the_baseline_and_a_fallback_is_a_failure():
    def replica(name, first, steady, **child):
        return {"name": name, "ok": True, "error": None, "process_s": 20.0, "remote": {}, "output": None,
                "child": {"first_output_s": first, "median_ms": steady, **child}}  # fmt: skip

    plan = fleet.plan_from(_args())
    runs = {
        "cold": [replica("cold-1", 10.0, 2.0), replica("cold-2", 14.0, 2.2), replica("cold-3", 12.0, 2.1)],
        "published": [
            replica("published-0", None, None, action="publish", file_bytes=2e6, publish_s=9.0),
            replica("published-1", 1.2, 2.1, how="published precompiled code"),
            replica("published-2", 11.0, 2.1, how="compiled here: no published entry"),
        ],
    }
    rows, table, failure = fleet.report(plan, runs, None)
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("published-1", "first_output_x_cold")] == pytest.approx(0.1)  # 1.2 s over the median 12 s
    assert value[("published-1", "steady_x_cold")] == pytest.approx(1.0)
    assert ("cold-1", "first_output_x_cold") not in value and ("published-0", "first_output_x_cold") not in value
    assert failure == "published-2: not served from the published code (compiled here: no published entry)"
    assert "cold median 12.00 s" in table and "published 2.0 MB in 9.0 s" in table
