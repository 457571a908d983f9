"""Compile once, serve everywhere (issue 35, item 3): precompiled code published to a real redis-server, replicas that
start from it with their own weights, and every way that cannot be, each falling back to a compile that says why."""

import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import fullgraph
from fullgraph.compile.guards import trusted_code
from fullgraph.deploy import published
from fullgraph.deploy.precompile import unsupported_reason
from fullgraph.deploy.remote import client
from fullgraph.deploy.remote_server import free_port
from tests.deploy._models import Linears
from tests.redis_server import redis_fixture  # noqa: F401  (the fixture `redis`)

pytest.importorskip("redis", reason="needs the redis client: pip install 'fullgraph[remote]'")
pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

KEY = "fleet-signing-key"
# A replica: a fresh process, an empty Inductor cache, its own weights; prints how it serves and what Dynamo did.
REPLICA = """
import json, sys, warnings, torch
from fullgraph.deploy import serve
from tests.deploy._models import Linears
from torch._dynamo.utils import counters
url, password, key, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.manual_seed(123)
model = Linears().eval()
x = torch.randn(rows, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    served = serve(model, (x,), url, password=password, key=key, preset="dev")
    y = served(x)
with torch.no_grad():
    err = (y - model(x)).abs().max().item()
print(json.dumps({"how": served.how, "err": err, "frames": counters["frames"].get("ok", 0),
                  "warnings": [str(w.message) for w in caught if "published" in str(w.message)]}))
"""


def replica(redis, tmp_path, rows=4, key=KEY):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{rows}-{len(key)}")}
    proc = subprocess.run([sys.executable, "-c", REPLICA, redis.url, redis.password, key, str(rows)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def published_key(redis, tmp_path_factory):
    torch.manual_seed(0)
    model = Linears().eval()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("publisher"))
    try:
        name, size = published.publish(model, (torch.randn(4, 8),), redis.url, password=redis.password, key=KEY)
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert name.startswith(published.PREFIX) and size > 1000
    return name


def test_a_replica_runs_the_published_code_with_its_own_weights_and_traces_nothing(redis, published_key, tmp_path):
    got = replica(redis, tmp_path)
    assert got["how"] == "published precompiled code" and got["warnings"] == []
    assert got["frames"] == 0  # Dynamo converted no frame: nothing traced, nothing compiled
    assert got["err"] < 1e-6


def test_other_inputs_find_nothing_and_compile_saying_why(redis, published_key, tmp_path):
    got = replica(redis, tmp_path, rows=5)
    assert got["how"].startswith("compiled here: nothing published under <redis://")
    assert len(got["warnings"]) == 1 and "not starting from the published code" in got["warnings"][0]
    assert got["frames"] >= 1 and got["err"] < 1e-6


def test_another_signing_key_is_refused_and_compiles(redis, published_key, tmp_path):
    got = replica(redis, tmp_path, key="another-key")
    assert "bad signature" in got["how"] and got["err"] < 1e-6


def serve_here(redis, x, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        served = published.serve(Linears().eval(), (x,), redis.url, password=redis.password, key=KEY, **kwargs)
    return served, [str(w.message) for w in caught if issubclass(w.category, published.PublishedWarning)]


def test_a_changed_entry_is_refused(redis, published_key):
    c = client(redis.url, redis.password, 1.0)
    original = c.get(published_key)
    try:
        c.set(published_key, original[:-10] + b"0123456789")  # the payload's last bytes changed
        served, said = serve_here(redis, torch.randn(4, 8))
        assert "bad signature" in served.how and len(said) == 1
    finally:
        c.set(published_key, original)
        c.close()


def test_a_guard_failing_at_the_first_call_falls_back_once(redis, published_key):
    served, said = serve_here(redis, torch.randn(4, 8))
    assert served.how == "published precompiled code" and said == []
    model = served.model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (6, 6, 7):  # not the published inputs: the precompiled code's guard fails, once
            x = torch.randn(rows, 8)
            with torch.no_grad():
                torch.testing.assert_close(served(x), model(x))
    notes = [str(w.message) for w in caught if issubclass(w.category, published.PublishedWarning)]
    assert len(notes) == 1 and "was precompiled for inputs 4x8:float32@cpu, not 6x8:float32@cpu" in notes[0]
    assert served.how.startswith("compiled here:")


def test_redis_down_costs_one_timeout_and_compiles():
    from fullgraph.deploy.remote import active

    if (fleet := active()) is not None:  # another test's fallback turned it on
        fleet.close()
    url = f"redis://127.0.0.1:{free_port()}/0"
    served = published.serve(Linears().eval(), (torch.randn(4, 8),), url, password="pw", key=KEY, timeout=0.3)
    assert served.how.startswith("compiled here: Redis failed: ConnectionError")
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(served(x), served.model(x))
    assert active() is None  # not asked again: the compile ran without the remote cache


def test_the_key_names_what_the_code_depends_on():
    model, x = Linears().eval(), torch.randn(4, 8)
    base = published.artifact_key(model, (x,), preset="dev")
    assert base == published.artifact_key(Linears().eval(), (torch.randn(4, 8),), preset="dev")  # other weights
    assert base != published.artifact_key(model, (torch.randn(5, 8),), preset="dev")
    assert base != published.artifact_key(model, (x,), preset="perception")
    assert base != published.artifact_key(model.double(), (x.double(),), preset="dev")
    with fullgraph.ops.policy(rms_norm="native"):
        assert base != published.artifact_key(model.float(), (x,), preset="dev")


def test_the_key_is_the_same_in_another_process():
    """The options carry functions (the guard filter): named by module and name, never by an id of this process."""
    code = ("import torch; from fullgraph.deploy import published; from tests.deploy._models import Linears; "
            "torch.manual_seed(0); "
            "print(published.artifact_key(Linears().eval(), (torch.zeros(4, 8),), preset='dev'))")  # fmt: skip
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)}  # fmt: skip
    assert len(keys) == 1 and keys != {""}
    assert "trusted_code" in json.dumps(published._options_text({"guard_filter_fn": trusted_code}))


class OneToken(torch.nn.Module):
    """Row-wise layers, then one token read: what the token_select rewrite slims (auto on the CPU too)."""

    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.head = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(self.fc(x)))[:, 0]


def test_the_published_code_is_compiled_with_the_presets_rewrites(redis, monkeypatch, tmp_path):
    # a cold replica compiles with the preset's default rewrites: the published code must be that code (on the H200
    # the published ViT-B/16 ran 1.2x slower than a cold replica's, compiled without them)
    from fullgraph.compile import rewrites

    applied = []
    monkeypatch.setattr(rewrites.Recorder, "add", lambda self, done, skipped: applied.extend(done))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(1)
    model, x = OneToken().eval(), torch.randn(3, 5, 8)
    options = published.describe(model, (x,), preset="dev")["options"]
    assert re.fullmatch(r".*RewritePass:[0-9a-f]{64}", options["pre_grad_custom_pass"])  # its identity keys it
    published.publish(model, (x,), redis.url, password=redis.password, key=KEY, preset="dev")
    assert [a.rewrite for a in applied] == ["token_select"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", published.PublishedWarning)
        served = published.serve(model, (x,), redis.url, password=redis.password, key=KEY, preset="dev")
        y = served(x)
    assert served.how == "published precompiled code"
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)


def test_cache_warm_fills_the_cache_and_publishes_what_a_replica_serves(redis, tmp_path, capsys, monkeypatch):
    from fullgraph.cli.main import main

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    c = client(redis.url, redis.password, 1.0)
    for name in c.scan_iter(match=published.PREFIX + "*"):
        c.delete(name)
    c.close()
    rc = main(["cache", "warm", "tests.deploy._models:linears", "--input", "3x8:fp32", "--device", "cpu",
               "--remote", redis.url, "--password", redis.password, "--key", KEY])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "published the precompiled code as fullgraph:precompiled:" in out, out
    got = replica(redis, tmp_path, rows=3)
    assert got["how"] == "published precompiled code" and got["frames"] == 0 and got["err"] < 1e-6


@pytest.mark.slow
def test_cache_warm_of_a_model_torch_cannot_save_fills_the_cache_and_says_why_nothing_was_published(
    redis, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("transformers")
    from fullgraph.cli.main import main

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    rc = main(["cache", "warm", "tests.deploy._models:tiny_bert", "--input", "2x8:int64", "--device", "cpu",
               "--remote", redis.url, "--password", redis.password, "--key", KEY])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    if "published the precompiled code" in out:
        pytest.skip(f"torch {torch.__version__} saves BERT's guards: nothing to refuse here")
    written = int(re.search(r"compiled in [\d.]+ s; remote cache \S+: (\d+) entries written", out).group(1))
    assert written >= 1  # the remote cache took the compiled graph all the same
    assert "not published for fullgraph.deploy.serve: torch " in out and "cannot save BertModel's compiled code" in out


@pytest.fixture(scope="module", autouse=True)
def _no_remote_cache_after():
    """A fallback turns the fleet's remote cache on for the process; later test modules must not inherit it."""
    yield
    from fullgraph.deploy.remote import active

    if (fleet := active()) is not None:
        fleet.close()
