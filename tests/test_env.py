import dataclasses
import importlib.util
import os

import pytest
import torch

from fullgraph import env
from tests.skips import requires_cuda, requires_triton


def test_has_triton_matches_import():
    assert env.has_triton() == (importlib.util.find_spec("triton") is not None)


def test_cuda_capability_matches_torch():
    if torch.cuda.is_available():
        assert env.cuda_capability() == torch.cuda.get_device_capability()
    else:
        assert env.cuda_capability() is None


def test_interpreter_context_restores_variable(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with env.interpreter():
        assert env.triton_interpret()
    assert "TRITON_INTERPRET" not in os.environ
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with env.interpreter():
        assert os.environ["TRITON_INTERPRET"] == "1"
    assert os.environ["TRITON_INTERPRET"] == "0"


@requires_triton
def test_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok, why = env.triton_runs_on("cpu")
    assert not ok and "TRITON_INTERPRET=1" in why
    with env.interpreter():
        assert env.triton_runs_on("cpu")[0]


@requires_triton
def test_interpreter_probe_runs_a_kernel(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = env.probe_triton("cpu")
    assert p.ok, p.detail
    assert "TRITON_INTERPRET" not in os.environ  # the probe leaves the process as it found it


def test_probe_without_triton(monkeypatch):
    monkeypatch.setattr(env, "has_triton", lambda: False)
    p = env.probe_triton("cpu")
    assert not p.ok and "not importable" in p.detail


def test_sdpa_math_probe_always_works():
    p = env.probe_sdpa("math", "cpu")
    assert p.ok and p.name == "sdpa-math"


def test_report_fields_are_json_and_complete():
    r = env.collect(probe=False)
    d = r.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(env.EnvReport)}
    assert d["torch"] == torch.__version__
    assert d["inductor_cache_dir"]
    assert set(d["triton_gpu"]) == {"name", "ok", "detail"}


@requires_cuda
def test_gpu_report():
    r = env.collect()
    assert r.cuda_available and r.gpu == torch.cuda.get_device_name(0)
    assert r.gpu_capability == "{}.{}".format(*torch.cuda.get_device_capability())
    assert r.triton_gpu.ok == env.has_triton(), r.triton_gpu.detail
    assert any(p.ok for p in r.attention if p.name in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"))


@requires_cuda
@pytest.mark.parametrize("backend", env.SDPA_BACKENDS)
def test_sdpa_probe_on_gpu_is_real(backend):
    p = env.probe_sdpa(backend, "cuda")
    # math serves every input; a fused backend that claims to work must have produced the right numbers
    assert p.ok or backend != "math", p.detail
