"""Issue 15's acceptance on the CPU: a package containing our ops loads and runs in a process that imports
`fullgraph` but not the model's code.

The model mixes policies: RMSNorm (with residual) and modulate take the kernel, LayerNorm the native form. The
native form traces to aten ops that Inductor compiles into the package. The kernels are Triton kernels, which on
a CPU run only in Triton's interpreter and are opaque custom ops there (fullgraph.kernels._library), so the package
calls them back through Python: loading needs their registration (`fullgraph.deploy.load` imports fullgraph.ops)
and TRITON_INTERPRET=1. (On a GPU they are `triton_op`s and Inductor compiles them into the package.)
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from fullgraph import ops
from fullgraph.deploy import export, load
from fullgraph.kernels.flash_attention import GLUON_MIN_QUERIES


class Block(nn.Module):
    """A DiT-like block from our ops: adaLN modulation of a LayerNorm, a linear layer, a fused residual RMSNorm."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.ln = ops.LayerNorm(dim, policy="native")
        self.ada = nn.Linear(dim, 2 * dim)
        self.mod = ops.Modulate(policy="kernel")
        self.fc = nn.Linear(dim, dim)
        self.norm = ops.RMSNorm(dim, policy="kernel")

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.ada(c).chunk(2, dim=-1)  # shift, scale: [B, C]
        h = self.mod(self.ln(x), shift[:, None], scale[:, None])  # h: [B, N, C]
        y, _ = self.norm(self.fc(h), residual=x)
        return y


# Runs in a fresh interpreter, in the test's tmp folder: `tests` is not importable there, and nothing imports it.
CHILD = """
import json, sys, torch
raw = None
if sys.argv[3] == "raw-first":  # torch's own loader, before anything of fullgraph is imported
    try:
        torch._inductor.aoti_load_package(sys.argv[1])
    except Exception as e:
        raw = str(e).splitlines()[0]
import fullgraph.deploy
try:
    loaded = fullgraph.deploy.load(sys.argv[1])
except fullgraph.deploy.DeployError as e:
    print(json.dumps({"raw": raw, "refused": str(e)}))
    sys.exit(0)
saved = torch.load(sys.argv[2])
with torch.no_grad():
    y = loaded(*saved["args"])
err = (y - saved["expected"]).abs().max().item()
foreign = sorted(m for m in sys.modules if m == "tests" or m.startswith("tests."))
print(json.dumps({"raw": raw, "err": err, "ops": loaded.custom_ops, "foreign": foreign}))
"""


def run_child(tmp_path, package, saved, mode: str, interpret: bool) -> dict:
    child_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        child_env["TRITON_INTERPRET"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(package), str(saved), mode],
        capture_output=True, text=True, env=child_env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_package_with_our_ops_runs_where_only_fullgraph_is_imported(tmp_path, triton_device):
    if triton_device != "cpu":
        pytest.skip("checks the CPU route (opaque kernel ops); on a GPU the kernels compile into the package")
    model = Block().eval()
    args = (torch.randn(3, 7, 32), torch.randn(3, 32))
    with torch.no_grad():
        expected = model(*args)
    package = export(model, args, tmp_path / "block.pt2")
    torch.save({"args": args, "expected": expected}, tmp_path / "io.pt")
    kernels = ("fullgraph::modulate", "fullgraph::rms_norm_residual")  # LayerNorm's native form is aten: compiled in
    assert load(package).custom_ops == kernels

    ran = run_child(tmp_path, package, tmp_path / "io.pt", "fullgraph-only", interpret=True)
    assert ran["foreign"] == []  # the model's code (this file) was never imported there
    assert ran["ops"] == list(kernels)
    assert ran["err"] < 1e-5

    # Without the interpreter: torch's own loader cannot even resolve our ops without fullgraph's registration, and
    # fullgraph.deploy.load, which registers them, refuses before the kernels could fail at the first call.
    refused = run_child(tmp_path, package, tmp_path / "io.pt", "raw-first", interpret=False)
    assert "Could not find schema for fullgraph::" in refused["raw"]
    assert (
        "calls fullgraph's Triton kernels as opaque ops (fullgraph::modulate, fullgraph::rms_norm_residual"
        in (refused["refused"])
    )
    assert "set TRITON_INTERPRET=1" in refused["refused"] and "--ops none" in refused["refused"]


class AttentionBlock(nn.Module):
    """qkv projection, our attention kernel (backend "triton", registered only on first use), output projection."""

    def __init__(self, dim: int = 64, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).unbind(2)  # each [B, N, H, D]
        return self.out(ops.attention(q, k, v, layout="bsnd", backend="triton").reshape(b, n, c))


@pytest.mark.slow
# On a Hopper GPU 2100 queries take the Gluon kernel (an opaque op): marked gpu, so `-m gpu` runs it (the interpreter
# at 2100 tokens would take minutes; the CPU route is the same opaque op at 37).
@pytest.mark.parametrize("tokens", [37, pytest.param(2100, marks=pytest.mark.gpu)])
def test_a_package_with_our_attention_kernel_runs_where_only_fullgraph_is_imported(tmp_path, triton_device, tokens):
    dtype = torch.bfloat16 if triton_device == "cuda" else torch.float32
    # head dim 64 at 2100 tokens: the Gluon kernel serves head dims 64 and 128 only (at 32 the Triton kernel ran,
    # traced into the package, and the check below found no Gluon op: H200, 2026-12-02)
    model = (AttentionBlock() if tokens < 2048 else AttentionBlock(dim=128)).to(triton_device, dtype).eval()
    args = (torch.randn(2, tokens, model.qkv.in_features, device=triton_device, dtype=dtype),)
    with torch.no_grad():
        expected = model(*args)
        reference = model.float()(args[0].float()).to(dtype)  # float32 math, for the tolerance
        model.to(dtype)
    package = export(model, args, tmp_path / "attn.pt2")
    torch.save({"args": args, "expected": expected}, tmp_path / "io.pt")
    # The child imports fullgraph.deploy alone: fullgraph.kernels.flash_attention, which registers the kernel's ops,
    # is imported by load because the package calls them (before, load refused such a package as unregistered).
    ran = run_child(tmp_path, package, tmp_path / "io.pt", "fullgraph-only", interpret=triton_device == "cpu")
    assert "refused" not in ran, ran.get("refused")
    assert ran["foreign"] == []
    opaque = [op for op in ran["ops"] if op.startswith("fullgraph::flash_attention")]
    if triton_device == "cpu":
        assert opaque == ["fullgraph::flash_attention"]  # the interpreter's kernel is an opaque op
    else:  # on a GPU Inductor traces into the Triton kernel; the Gluon kernel stays an opaque op
        gluon = tokens >= GLUON_MIN_QUERIES and torch.cuda.get_device_capability()[0] == 9
        assert opaque == (["fullgraph::flash_attention_gluon"] if gluon else [])
    tol = 1e-5 if dtype == torch.float32 else 2 * (expected - reference).abs().max().item() + 1e-2
    assert ran["err"] <= tol
