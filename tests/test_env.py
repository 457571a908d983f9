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
    assert p.detail == "ran and matched float64 (float32 head dim 64 on cpu)"


def test_attention_probes_are_real_sdpa_calls_only():
    # Installed-or-not is the attention dispatch's answer (`fullgraph env` shows both); a probe is a real call.
    probes = env.probe_attention("cpu")
    assert [p.name for p in probes] == [f"sdpa-{b}" for b in env.SDPA_BACKENDS]
    by_name = {p.name: p for p in probes}
    assert by_name["sdpa-math"].ok
    assert not by_name["sdpa-cudnn"].ok and by_name["sdpa-cudnn"].detail == "no kernel for float32 head dim 64 on cpu"


def test_a_wrong_sdpa_result_is_not_usable(monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda q, k, v: real(q, k, v) * 1.5)
    p = env.probe_sdpa("math", "cpu")
    assert not p.ok and p.detail.startswith("ran but relative error")


def _sdpa_flags() -> dict:
    b = torch.backends.cuda
    return {
        "flash": b.flash_sdp_enabled(),
        "efficient": b.mem_efficient_sdp_enabled(),
        "cudnn": b.cudnn_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }


@pytest.mark.parametrize("name", ["flash", "efficient", "cudnn", "math"])
def test_only_sdpa_pins_one_backend_and_restores_the_flags(name):
    torch.backends.cuda.enable_cudnn_sdp(False)  # a state other than the default, which must come back as it was
    try:
        before = _sdpa_flags()
        with env.only_sdpa(name):
            assert _sdpa_flags() == {n: n == name for n in before}
        assert _sdpa_flags() == before
        with pytest.raises(RuntimeError), env.only_sdpa(name):
            raise RuntimeError("a backend refused")
        assert _sdpa_flags() == before
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


def test_only_sdpa_names_the_backends_it_knows():
    from fullgraph.errors import UsageError

    with pytest.raises(UsageError, match=r"unknown SDPA sub-backend 'flashy'.*flash, efficient, cudnn, math"):
        env.only_sdpa("flashy")


def test_the_sdpa_ops_run_under_their_pinned_backend(monkeypatch):
    """Each sdpa-* backend of `attention` calls SDPA with only its own sub-backend enabled."""
    from fullgraph.ops.attention import attention

    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(_sdpa_flags())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 2, 8, 16)
    attention(q, q, q, backend="sdpa-math")
    assert seen == [{"flash": False, "efficient": False, "cudnn": False, "math": True}]


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


@pytest.mark.parametrize(
    "version, expected",
    [("3.6.0", True), ("3.10.1", True), ("3.5.1", False), ("3.6.0+git1a2b3c", True), ("4.0rc1", True), (None, False)],
)
def test_triton_at_least_compares_numbers_not_strings(monkeypatch, version, expected):
    monkeypatch.setattr(env, "triton_version", lambda: version)
    assert env.triton_at_least(3, 6) is expected
