"""A real redis-server for the tests that need one (`fullgraph.deploy.remote_server`): on a free port under a
temporary folder, with a password, nothing saved; skipped with the reason when redis-server or the redis package
is missing. Use: `from tests.redis_server import redis_fixture  # noqa: F401` and take `redis` as a fixture."""

import pytest


@pytest.fixture(scope="module", name="redis")
def redis_fixture(tmp_path_factory):
    from fullgraph.deploy.remote_server import missing, redis_server

    if why := missing():
        pytest.skip(why)
    with redis_server(str(tmp_path_factory.mktemp("redis"))) as server:
        yield server
