import argparse

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
def test_later_replicas_have_no_remote_fx_graph_misses(redis):
    """Two fresh processes with empty local caches (a CPU compile of a 1-block ViT is ~40 s each on 2 cores): the
    second one's FX graph comes from Redis."""
    rows, table, failure = fleet.run(_args(remote=f"redis://:{redis.password}@127.0.0.1:{redis.port}/0"),
                                     fleet.Sources(None, lambda msg: None))  # fmt: skip
    assert failure is None, table
    value = {(r.variant, r.metric): r.value for r in rows}
    assert value[("sequential-2", "fxgraph_cache_hit")] == 1 and value[("sequential-2", "fxgraph_cache_miss")] == 0
    assert value[("sequential-2", "remote_miss")] == 0 and value[("sequential-2", "remote_refused")] == 0
    assert value[("sequential-1", "remote_put")] >= 1 and value[("sequential-2", "rel_err")] < 1e-4
