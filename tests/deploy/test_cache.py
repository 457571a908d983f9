import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from fullgraph.deploy import DeployError, cache, load_cache, read_cache, save_cache, save_cache_in_child
from fullgraph.deploy._common import environment

ROOT = Path(__file__).resolve().parents[2]


def forge(path: Path, payload: bytes = b"artifacts", **changes) -> Path:
    """A cache file as save_cache writes it, with header fields changed: nothing in it is ever unpickled here."""
    meta = cache.CacheMeta(
        **environment(),
        preset="dev",
        signature="4x8:float32@cpu",
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_bytes=len(payload),
    )
    header = json.dumps({**asdict(meta), **changes}).encode() + b"\n"
    path.write_bytes(cache.MAGIC + header + payload)
    path.chmod(0o644)
    return path


@pytest.mark.slow
def test_artifacts_saved_in_a_child_are_hit_by_a_fresh_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-save"))
    path = tmp_path / "mlp.fgcache"
    meta = save_cache_in_child("tests.deploy._models:linears", path, preset="dev")
    assert meta.artifacts.get("inductor", 0) >= 1, meta
    assert (meta.preset, meta.signature, meta.device) == ("dev", "4x8:float32@cpu", environment()["device"])
    assert path.stat().st_mode & 0o777 == 0o644

    # A fresh process with an empty Inductor cache: every FX graph must come from the file.
    code = f"from tests.deploy._models import load_and_run; load_and_run({str(path)!r}, {meta.signature!r})"
    child_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-load"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["inductor"].get("fxgraph_cache_hit", 0) >= 1, report
    assert report["inductor"].get("fxgraph_cache_miss", 0) == 0, report
    assert report["aot_autograd"].get("autograd_cache_hit", 0) >= 1, report
    assert report["aot_autograd"].get("autograd_cache_miss", 0) == 0, report
    assert report["err"] < 1e-5, report


def test_a_file_from_another_torch_is_refused_naming_both_versions(tmp_path):
    path = forge(tmp_path / "old.fgcache", torch="2.11.0+cu128")
    with pytest.raises(DeployError) as e:
        load_cache(path)
    msg = str(e.value)
    assert f"torch 2.11.0+cu128 there, {torch.__version__} here" in msg
    assert "compile the model again in this environment and save a new file" in msg
    assert "\n" not in msg


def test_a_file_from_another_gpu_is_refused(tmp_path):
    path = forge(tmp_path / "gpu.fgcache", device="NVIDIA H200", capability="9.0")
    here = environment()
    if here["device"] == "NVIDIA H200" and here["capability"] == "9.0":
        path = forge(tmp_path / "gpu.fgcache", device="cpu", capability=None)
    with pytest.raises(DeployError, match=r"refusing cache artifacts .*device .* there, .* here"):
        load_cache(path)


def test_preset_and_inputs_are_checked_when_given(tmp_path):
    path = forge(tmp_path / "m.fgcache")
    with pytest.raises(DeployError, match="preset dev there, perception here"):
        load_cache(path, preset="perception")
    with pytest.raises(DeployError, match=r"inputs 4x8:float32@cpu there, 2x8:float32@cpu here"):
        load_cache(path, signature="2x8:float32@cpu")
    meta, payload = read_cache(path)  # everything matches: the header and the payload come back
    assert (meta.preset, payload) == ("dev", b"artifacts")


def test_truncated_damaged_and_foreign_files_are_refused(tmp_path):
    path = forge(tmp_path / "m.fgcache", payload=os.urandom(1000))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DeployError, match="damaged or truncated"):
        load_cache(path)
    other = tmp_path / "other.fgcache"
    other.write_bytes(b"\x80\x04some pickle")
    other.chmod(0o644)
    with pytest.raises(DeployError, match="not a fullgraph cache file"):
        load_cache(other)
    bad_header = tmp_path / "bad.fgcache"
    bad_header.write_bytes(cache.MAGIC + b"{not json\n" + b"x")
    bad_header.chmod(0o644)
    with pytest.raises(DeployError, match="damaged header"):
        load_cache(bad_header)


def test_a_file_others_can_write_is_refused_before_reading(tmp_path):
    path = forge(tmp_path / "m.fgcache")
    path.chmod(0o666)
    with pytest.raises(DeployError, match=r"writable by group and others \(mode 666\).*chmod go-w"):
        load_cache(path)


def test_nothing_compiled_means_nothing_to_save(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    with pytest.raises(DeployError, match="nothing was compiled"):
        save_cache(tmp_path / "empty.fgcache")
    assert not (tmp_path / "empty.fgcache").exists()


def test_the_child_needs_an_importable_builder(tmp_path):
    from fullgraph.errors import UsageError

    with pytest.raises(UsageError, match="top level of a module"):
        save_cache_in_child(lambda: None, tmp_path / "x.fgcache")
    with pytest.raises(UsageError, match="must be Python literals"):
        save_cache_in_child("tests.deploy._models:linears", tmp_path / "x.fgcache", options={"f": object()})
