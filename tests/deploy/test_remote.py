import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

from fullgraph.deploy import remote
from fullgraph.deploy._common import environment
from fullgraph.deploy.remote import (
    LEASE_PREFIX,
    MAGIC,
    RemoteCacheWarning,
    SignedRedisBackend,
    entries,
    remote_cache,
    unwrap,
    wrap,
)
from fullgraph.deploy.remote_server import free_port
from fullgraph.errors import UsageError
from tests.redis_server import redis_fixture  # noqa: F401  (the fixture `redis`)

redis_client = pytest.importorskip("redis", reason="needs the redis client: pip install 'fullgraph[remote]'")

KEY = "test-signing-key"
TIMEOUT = 0.5
# A child process with an empty local cache: turn on the remote cache, compile, print counters and our stats.
CHILD = """
import json, sys, torch
from fullgraph.deploy.remote import remote_cache
from torch._dynamo.utils import counters
url, password, key = sys.argv[1:4]
fleet = remote_cache(url, password=password, key=key)
torch.manual_seed(0)
x, w, b = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
out = torch.compile(lambda x, w, b: torch.addmm(b, x, w))(x, w, b)
print(json.dumps({"inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"]),
                  "stats": fleet.stats(), "err": (out - torch.addmm(b, x, w)).abs().max().item()}))
"""


def _child(redis, tmp_path, name):
    cache = tmp_path / name
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-c", CHILD, redis.url, redis.password, KEY], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_from_redis_with_empty_local_cache(redis, tmp_path):
    first = _child(redis, tmp_path, "first")
    assert first["stats"]["put"] >= 1 and first["err"] < 1e-5
    second = _child(redis, tmp_path, "second")
    assert second["inductor"].get("fxgraph_cache_hit") == 1
    assert not second["inductor"].get("fxgraph_cache_miss")
    assert second["aot"].get("autograd_cache_hit") == 1 and not second["aot"].get("autograd_cache_miss")
    assert second["stats"]["refused"] == 0 and second["stats"]["miss"] == 0 and second["err"] < 1e-5
    found = entries(redis.url, password=redis.password)
    assert found["fx-graph-v1"]["entries"] >= 1 and found["fx-graph-v1"]["hits"] >= 1


# ---- in this process: only the remote cache is asked (local caches off), Dynamo reset before each compile --------


def _compile_once(seed=1):
    """Compile and run a small graph with only the remote caches on; the output's error against eager."""
    torch._dynamo.reset()
    torch.manual_seed(seed)
    x, w = torch.randn(6, 10), torch.randn(10, 3)
    fn = torch.compile(lambda x, w: torch.relu(x @ w) * 2)
    patches = (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    )
    with patches[0], patches[1]:
        out = fn(x, w)
    return (out - torch.relu(x @ w) * 2).abs().max().item()


def _torch_entries(redis):
    c = redis_client.Redis.from_url(redis.url, password=redis.password)
    return c, [k.decode() for k in c.scan_iter(match="pt2:*")]


def _rewrite(redis, change):
    """Rewrite every entry (FX graph and AOTAutograd) in Redis with `change(key, payload) -> bytes`."""
    c, keys = _torch_entries(redis)
    assert any(k.startswith("pt2:fx-graph-v1::") for k in keys)
    for k in keys:
        payload, why = unwrap(KEY.encode(), k, c.get(k), environment())
        assert why is None
        c.set(k, change(k, payload))


def _refused_after(redis, change, match):
    _torch_entries(redis)[0].flushdb()  # only this test's entries
    with remote_cache(redis.url, password=redis.password, key=KEY) as fleet:
        assert _compile_once() < 1e-5
        _rewrite(redis, change)
        with pytest.warns(RemoteCacheWarning, match=match) as caught:
            assert _compile_once() < 1e-5  # refused, compiled locally: still correct
        stats = fleet.stats()
    lines = [str(w.message) for w in caught if issubclass(w.category, RemoteCacheWarning)]
    assert all("\n" not in line for line in lines)
    assert stats["by_cache"].get("fx-graph-v1.refused") == 1 and stats["hit"] == 0 and stats["off"] is None


def test_entry_from_another_torch_is_refused(redis):
    here = torch.__version__
    other = "2.11.0" if here != "2.11.0" else "2.13.0"

    def foreign(key, payload):
        return wrap(KEY.encode(), key, payload, {**environment(), "torch": other})

    _refused_after(redis, foreign, re.escape(f"torch {other} there, {here} here"))


def test_entry_with_bad_signature_is_refused(redis):
    def tampered(key, payload):
        good = wrap(KEY.encode(), key, payload, environment())
        return good[:-1] + bytes([good[-1] ^ 1])

    _refused_after(redis, tampered, "bad signature")


def test_entry_written_by_torch_itself_is_refused(redis):
    _refused_after(redis, lambda key, payload: payload, "not signed by fullgraph")


def test_wrong_password_is_reported_once(redis):
    with warnings.catch_warnings(record=True) as caught, remote_cache(redis.url, password="wrong", key=KEY) as fleet:
        warnings.simplefilter("always")
        assert _compile_once(2) < 1e-5
        assert _compile_once(3) < 1e-5
        stats = fleet.stats()
    said = [str(w.message) for w in caught if issubclass(w.category, RemoteCacheWarning)]
    assert len(said) == 1 and "refused the password" in said[0] and "compiling locally" in said[0], said
    assert stats["skipped"] >= 1 and stats["hit"] == stats["put"] == 0


def _timed_without_redis(url, password, match):
    """Compile with Redis unusable: the wait for Redis stays within one timeout, and only the first op waits."""
    _compile_once(4)  # the same graph compiled locally first: C++ and Python imports warm, a fair baseline
    start = time.perf_counter()
    _compile_once(5)
    local_s = time.perf_counter() - start
    with pytest.warns(RemoteCacheWarning, match=match), remote_cache(url, password=password, key=KEY,
                                                                      timeout=TIMEOUT) as fleet:  # fmt: skip
        start = time.perf_counter()
        assert _compile_once(6) < 1e-5
        remote_s = time.perf_counter() - start
        stats = fleet.stats()
    assert stats["slowest_s"] <= TIMEOUT * 1.2 + 0.05, stats
    assert stats["redis_s"] <= TIMEOUT * 1.2 + 0.1, stats
    assert stats["skipped"] >= 1  # later lookups and writes did not ask Redis
    assert remote_s <= local_s + TIMEOUT + 1.0, (remote_s, local_s)


@pytest.mark.exclusive
def test_refused_connection_costs_at_most_one_timeout():
    _timed_without_redis(f"redis://127.0.0.1:{free_port()}/0", "pw", "compiling locally")


@pytest.mark.exclusive
def test_paused_redis_costs_at_most_one_timeout(redis):
    os.kill(redis.pid, signal.SIGSTOP)
    try:
        _timed_without_redis(redis.url, redis.password, f"did not answer within {TIMEOUT:g} s")
    finally:
        os.kill(redis.pid, signal.SIGCONT)


# ---- compile once per fleet: claims on missed entries ------------------------------------------------------------

# Replicas that start together: each waits at a barrier (a file per replica in a folder) after its imports, so that
# all look up the graph within milliseconds of each other.
TOGETHER = """
import json, os, sys, time, torch
from fullgraph.deploy.remote import remote_cache
from torch._dynamo.utils import counters
url, password, key, barrier, n = sys.argv[1:6]
fleet = remote_cache(url, password=password, key=key)
open(os.path.join(barrier, str(os.getpid())), "w").close()
while len(os.listdir(barrier)) < int(n):
    time.sleep(0.005)
torch.manual_seed(0)
x, w, b = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4)
out = torch.compile(lambda x, w, b: torch.nn.functional.gelu(torch.addmm(b, x, w)))(x, w, b)
print(json.dumps({"inductor": dict(counters["inductor"]), "stats": fleet.stats(),
                  "err": (out - torch.nn.functional.gelu(torch.addmm(b, x, w))).abs().max().item()}))
"""


def test_replicas_starting_together_compile_once(redis, tmp_path):
    _torch_entries(redis)[0].flushdb()
    n = 3
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", TOGETHER, redis.url, redis.password, KEY, str(barrier), str(n)],
                              env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"local{i}")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]  # fmt: skip
    got = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        got.append(json.loads(out.strip().splitlines()[-1]))
    claimed = [g for g in got if g["stats"]["claimed"]]
    assert len(claimed) == 1, [g["stats"] for g in got]  # one replica compiled
    others = [g for g in got if not g["stats"]["claimed"]]
    for g in others:  # the others loaded its entries: no miss anywhere, FX graph from Redis
        assert g["stats"]["miss"] == 0 and g["stats"]["refused"] == 0, g["stats"]
        assert g["inductor"].get("fxgraph_cache_hit") == 1 and not g["inductor"].get("fxgraph_cache_miss")
    assert any(g["stats"]["waited"] for g in others), [g["stats"] for g in got]  # at least one arrived while it ran
    assert all(g["err"] < 1e-5 for g in got)
    c = _torch_entries(redis)[0]
    assert not list(c.scan_iter(match=LEASE_PREFIX + "*"))  # every claim released


def _backend(redis, **kw):
    return SignedRedisBackend(redis.url, password=redis.password, key=KEY, timeout=TIMEOUT, **kw)


def test_a_waiter_loads_the_entry_the_claimant_puts(redis):
    key = "pt2:fx-graph-v1::waiter-test:c1"
    holder, waiter = _backend(redis), _backend(redis)
    assert holder.get(key) is None and holder.stats()["claimed"] == 1  # a miss: claimed, this one compiles
    threading.Timer(0.6, holder.put, (key, b"compiled code")).start()
    start = time.perf_counter()
    assert waiter.get(key) == b"compiled code"
    took = time.perf_counter() - start
    stats = waiter.stats()
    assert stats["waited"] == 1 and stats["hit"] == 1 and stats["miss"] == 0 and 0.5 <= stats["waited_s"] <= took
    assert not _torch_entries(redis)[0].exists(LEASE_PREFIX + key)  # put released the claim


def test_a_killed_claimants_claim_lapses_and_the_waiter_compiles(redis, monkeypatch):
    key = "pt2:autograd-experimental::lapse-test:c1"
    c = _torch_entries(redis)[0]
    c.set(LEASE_PREFIX + key, "another-replica", px=800)  # claimed by a process that then died: nothing renews it
    waiter = _backend(redis)
    start = time.perf_counter()
    assert waiter.get(key) is None
    took = time.perf_counter() - start
    stats = waiter.stats()
    assert 0.6 <= took <= 0.8 + 0.5 and stats["waited"] == 1 and stats["miss"] == 1, (took, stats)
    assert stats["claimed"] == 0  # it compiles without claiming again


def test_a_claim_is_renewed_while_its_holder_compiles(redis, monkeypatch):
    monkeypatch.setattr(remote, "LEASE_TTL_S", 0.6)
    key = "pt2:fx-graph-v1::renew-test:c1"
    holder = _backend(redis)
    assert holder.get(key) is None
    c = _torch_entries(redis)[0]
    time.sleep(1.5)  # more than two TTLs: only renewal keeps it
    assert c.get(LEASE_PREFIX + key) is not None
    holder.put(key, b"x")
    assert c.get(LEASE_PREFIX + key) is None


def test_waiting_longer_than_wait_warns_once_and_compiles(redis):
    key = "pt2:fx-graph-v1::slow-test:c1"
    holder, waiter = _backend(redis), _backend(redis, wait=0.5)
    assert holder.get(key) is None  # claimed and renewed, never put
    with pytest.warns(RemoteCacheWarning, match=r"waited 0\.5 s for the fx-graph-v1 entry") as caught:
        start = time.perf_counter()
        assert waiter.get(key) is None
    assert time.perf_counter() - start < 0.5 + 0.5
    assert len([w for w in caught if issubclass(w.category, RemoteCacheWarning)]) == 1
    holder.release_all()
    assert not _torch_entries(redis)[0].exists(LEASE_PREFIX + key)


def test_a_claim_its_holder_never_fills_is_released_when_the_compile_ends(redis):
    key = "pt2:fx-graph-v1::uncacheable-test:c1"
    holder = _backend(redis)
    torch._dynamo.reset()  # (it clears Dynamo's compile callbacks: a claim registers its own again)
    assert holder.get(key) is None  # claimed, as inside a compile that never saves this entry
    assert _torch_entries(redis)[0].exists(LEASE_PREFIX + key)
    torch.compile(lambda x: x + 1)(torch.ones(2))  # a compile ends
    assert not _torch_entries(redis)[0].exists(LEASE_PREFIX + key)


def test_no_claims_with_wait_zero_or_for_autotuning(redis):
    c = _torch_entries(redis)[0]
    backend = _backend(redis, wait=0)
    assert backend.get("pt2:fx-graph-v1::nowait-test:c1") is None
    assert _backend(redis).get("pt2:autotune-best-config-v2::tune-test:c1") is None
    assert not c.exists(LEASE_PREFIX + "pt2:fx-graph-v1::nowait-test:c1")
    assert not c.exists(LEASE_PREFIX + "pt2:autotune-best-config-v2::tune-test:c1")
    with pytest.raises(UsageError, match="wait=-1"):
        _backend(redis, wait=-1)


# ---- entries, arguments ------------------------------------------------------------------------------------------


def test_wrap_and_unwrap():
    env = {"torch": "2.13.0", "triton": "3.8.0", "fullgraph": "0.1", "device": "cpu", "capability": None}
    data = wrap(b"k", "pt2:fx-graph-v1::abc:c1", b"payload\nwith lines", env)
    assert data.startswith(MAGIC)
    assert unwrap(b"k", "pt2:fx-graph-v1::abc:c1", data, env) == (b"payload\nwith lines", None)
    assert "bad signature" in unwrap(b"other", "pt2:fx-graph-v1::abc:c1", data, env)[1]
    assert "bad signature" in unwrap(b"k", "pt2:fx-graph-v1::moved:c1", data, env)[1]  # moved to another key
    assert unwrap(b"k", "pt2:fx-graph-v1::abc:c1", data, {**env, "device": "NVIDIA H200", "capability": "9.0"})[1] == (
        "device cpu there, NVIDIA H200 here, capability None there, 9.0 here"
    )


def test_arguments_are_checked(monkeypatch):
    monkeypatch.delenv("FULLGRAPH_REMOTE_CACHE", raising=False)
    monkeypatch.delenv("FULLGRAPH_REMOTE_CACHE_KEY", raising=False)
    with pytest.raises(UsageError, match="FULLGRAPH_REMOTE_CACHE"):
        remote_cache()
    with pytest.raises(UsageError, match="signing key"):
        remote_cache("redis://127.0.0.1:1/0", password="pw")
    with pytest.raises(UsageError, match="password"):
        remote_cache("redis://127.0.0.1:1/0", key=KEY)
    with pytest.raises(UsageError, match="rediss://"):
        remote_cache("http://127.0.0.1:1/0", password="pw", key=KEY)


def test_environment_variables_and_url_password(monkeypatch):
    monkeypatch.setenv("FULLGRAPH_REMOTE_CACHE", "rediss://:secret@cache.example:6380/2")
    monkeypatch.setenv("FULLGRAPH_REMOTE_CACHE_KEY", KEY)
    with remote_cache() as fleet:  # nothing is contacted before a compile asks
        assert fleet.url == "rediss://cache.example:6380/2"
        kwargs = fleet.backend._client.connection_pool.connection_kwargs
        assert kwargs["password"] == "secret" and kwargs["socket_timeout"] == 1.0
        assert fleet.backend.wait == remote.DEFAULT_WAIT_S
    monkeypatch.setenv("FULLGRAPH_REMOTE_CACHE_WAIT", "45")
    with remote_cache() as fleet:
        assert fleet.backend.wait == 45.0
    monkeypatch.setenv("FULLGRAPH_REMOTE_CACHE_WAIT", "soon")
    with pytest.raises(UsageError, match="FULLGRAPH_REMOTE_CACHE_WAIT='soon': give seconds"):
        remote_cache()


def test_missing_client_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(Exception, match=r"pip install 'fullgraph\[remote\]'"):
        remote_cache("redis://127.0.0.1:1/0", password="pw", key=KEY)
