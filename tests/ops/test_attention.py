"""`attention` against a float64 reference on every backend that serves here; bad inputs; `Attention` compiled."""

import math

import pytest
import torch
from torch import nn

import fullgraph.kernels.flash_attention as fa
from fullgraph import env, replay
from fullgraph.errors import UsageError
from fullgraph.ops import RotaryEmbedding, counters, measured
from fullgraph.ops.attention import BACKENDS, Attention, attention
from fullgraph.ops.attention_backends import clear_memory, serve_reason, spec_of
from tests.kernels.reference import assert_close, rel_err

DEVICE = "cuda" if env.has_cuda() else "cpu"
LENGTHS = [1, 77, 197] + ([1000] if DEVICE == "cuda" else [])
# (causal, mask kind, gqa, layout): each feature appears with the others in more than one combination
CASES = [
    (False, None, False, "bnsd"),
    (True, None, True, "bsnd"),
    (False, "bool", False, "bsnd"),
    (False, "float", True, "bnsd"),
    (True, "bool", True, "bnsd"),
]


@pytest.fixture(autouse=True)
def fresh_choices(tmp_path, monkeypatch):
    monkeypatch.setenv("FULLGRAPH_CACHE_DIR", str(tmp_path))
    clear_memory()
    yield
    clear_memory()


def reference(q, k, v, causal, mask, scale):
    """float64 softmax(q kᵀ · scale + mask) v on [B, H, N, D] inputs, k/v heads repeated for GQA."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    return torch.softmax(s, dim=-1) @ v


def make_inputs(device, dtype, n, d, causal, mask_kind, gqa, layout):
    b, hq, hkv = 2, 4, (2 if gqa else 4)
    nk = n if causal else n + 3  # cross-attention lengths when causal does not need Nq == Nk
    q = torch.randn(b, hq, n, d, device=device, dtype=dtype)
    k = torch.randn(b, hkv, nk, d, device=device, dtype=dtype)
    v = torch.randn(b, hkv, nk, d, device=device, dtype=dtype)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(b, 1, n, nk, device=device) < 0.7
        mask[..., 0] = True  # every query sees key 0, which causal masking never hides: no empty rows
    elif mask_kind == "float":
        mask = torch.randn(1, hq, n, nk, device=device, dtype=dtype)
    if layout == "bsnd":  # the same values, stored [B, N, H, D]
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return q, k, v, mask


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"causal{int(c[0])}-{c[1]}-gqa{int(c[2])}-{c[3]}")
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_matches_float64_reference(request, backend, n, d, case):
    causal, mask_kind, gqa, layout = case
    device = request.getfixturevalue("triton_device") if backend == "triton" else DEVICE
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, mask = make_inputs(device, dtype, n, d, causal, mask_kind, gqa, layout)
    if backend != "auto":
        why = serve_reason(backend, *spec_of(q, k, mask, causal))
        if why:
            pytest.skip(f"{backend}: {why}")
        if not BACKENDS[backend].exact:
            pytest.skip(f"{backend} is quantized; its accuracy is its own package's to test")
    args = (q, k, v) if layout == "bnsd" else (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    before = sum(c for key, c in counters.items() if key[:2] == ("attention", "eager"))
    try:
        out = attention(*args, layout=layout, causal=causal, attn_mask=mask, backend=backend)
    except UsageError as e:
        # cuDNN's own heuristics refuse some single-token calls the table cannot foresee ("No available
        # kernel"); that refusal must be this clear error (`auto` then times the others), and is not a wrong answer
        if backend == "sdpa-cudnn" and n == 1 and "refused these inputs" in str(e):
            pytest.skip(f"sdpa-cudnn refused at run time: {e}")
        raise
    assert sum(c for key, c in counters.items() if key[:2] == ("attention", "eager")) == before + 1
    if backend != "auto":
        assert counters[("attention", "eager", backend)] > 0
    expect = reference(q, k, v, causal, mask, 1 / math.sqrt(d))
    if layout == "bsnd":
        expect = expect.transpose(1, 2)
    assert_close(out, expect, dtype, scale=5)


def test_scale_is_used():
    q, k, v, _ = make_inputs(DEVICE, torch.float32, 33, 64, False, None, False, "bnsd")
    out = attention(q, k, v, scale=0.3, backend="sdpa-math")
    assert rel_err(out, reference(q, k, v, False, None, 0.3)) < 1e-5
    assert rel_err(attention(q, k, v, backend="sdpa-math"), reference(q, k, v, False, None, 0.3)) > 1e-3


def test_bsnd_output_is_contiguous_without_input_copies():
    q = torch.randn(2, 50, 4, 64, device=DEVICE)
    out = attention(q, q, q, layout="bsnd")
    assert out.shape == q.shape and out.is_contiguous()


@pytest.mark.parametrize("q_order", ["bnsd", "bsnd"])
@pytest.mark.parametrize("out_order", ["bnsd", "bsnd"])
def test_cudnn_output_keeps_q_memory_order_as_its_fake_promises(q_order, out_order):
    """The sdpa-cudnn op returns q's memory order (no copy when cuDNN already wrote it so) with the strides
    its fake states, whatever order the library hands back."""
    from fullgraph.ops.attention_backends import _fake_like_q, _q_memory

    b, h, n, d = 2, 3, 5, 8
    q = torch.randn(b, h, n, d) if q_order == "bnsd" else torch.randn(b, n, h, d).transpose(1, 2)
    out = torch.randn(b, h, n, d) if out_order == "bnsd" else torch.randn(b, n, h, d).transpose(1, 2)
    kept = _q_memory(out, q)
    assert torch.equal(kept, out)
    assert kept.stride() == _fake_like_q(q, q, q, None, False, 1.0).stride()
    assert (kept.data_ptr() == out.data_ptr()) == (q_order == out_order)


def _bad(**changes):
    q = torch.randn(2, 4, 8, 16)
    kv = torch.randn(2, 2, 8, 16)
    args = {"q": q, "k": kv, "v": kv.clone(), "layout": "bnsd", "attn_mask": None, "backend": "auto"}
    args.update(changes)
    return args


BAD = {
    "q not 4-D": (_bad(q=torch.randn(4, 8, 16)), "q must be 4-D"),
    "k not 4-D": (_bad(k=torch.randn(2, 2, 8)), "k must be 4-D"),
    "k head dim": (_bad(k=torch.randn(2, 2, 8, 32)), "k's head dim"),
    "v head dim": (_bad(v=torch.randn(2, 2, 8, 32)), "v's head dim"),
    "v length": (_bad(v=torch.randn(2, 2, 9, 16)), "v must have k's length"),
    "batch": (_bad(k=torch.randn(3, 2, 8, 16), v=torch.randn(3, 2, 8, 16)), "q's batch size"),
    "gqa heads": (_bad(k=torch.randn(2, 3, 8, 16), v=torch.randn(2, 3, 8, 16)), "multiple of k's and v's heads"),
    "mask shape": (_bad(attn_mask=torch.ones(8, 9, dtype=torch.bool)), "attn_mask must be broadcastable to"),
    "mask dtype": (_bad(attn_mask=torch.ones(8, 8, dtype=torch.int64)), "attn_mask must be boolean"),
    "layout": (_bad(layout="bhsd"), "layout must be"),
    "backend": (_bad(backend="xformers"), "backend must be"),
    "int dtype": (_bad(q=torch.ones(2, 4, 8, 16, dtype=torch.int32)), "q must be a float tensor"),
    "mixed dtype": (_bad(k=torch.randn(2, 2, 8, 16, dtype=torch.float64)), "share a dtype"),
    "mixed device": (_bad(v=torch.randn(2, 2, 8, 16, device="meta")), "v is on meta"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_input_names_the_argument(name):
    args, message = BAD[name]
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(UsageError, match=message):
        attention(q, k, v, **args)


def test_mask_error_states_the_expected_shape():
    with pytest.raises(UsageError, match=r"\[2, 4, 8, 8\]"):
        attention(*(torch.randn(2, 4, 8, 16) for _ in range(3)), attn_mask=torch.ones(3, 8, 8, dtype=torch.bool))


def test_explicit_backend_that_cannot_serve_says_why_and_what_to_do():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(UsageError, match=r"backend 'sdpa-cudnn' cannot serve .*does not run on cpu.*backend='auto'"):
        attention(q, q, q, backend="sdpa-cudnn")
    with pytest.raises(UsageError, match=r"backend 'sdpa-flash' cannot serve .*float64"):
        attention(*(t.double() for t in (q, q, q)), backend="sdpa-flash")
    with pytest.raises(UsageError, match=r"backend 'triton' cannot serve .*attn_mask"):
        attention(q, q, q, attn_mask=torch.zeros(8, 8), backend="triton")


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), x + mlp(norm(x))."""

    def __init__(self, dim=64, heads=4, backend="auto"):
        super().__init__()
        rope = RotaryEmbedding(dim // heads, max_seq_len=128, layout="bsnd")
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, kv_heads=2, qk_norm=True, rope=rope, causal=True, backend=backend)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def graphed_kernel_fits(q: torch.Tensor) -> bool:
    """Does ops/measured.py put our kernel ahead for `q` in code replayed from CUDA graphs?"""
    with replay.replayed():
        return measured.graphed_kernel_fits("attention", q.device, q.numel())


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_block_compiles_whole_and_matches_eager(request, monkeypatch, backend, mode, head_dim):
    device = request.getfixturevalue("triton_device") if backend == "triton" else DEVICE
    if mode == "reduce-overhead" and device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    if head_dim == 64 and device != "cuda":
        pytest.skip("head dim 64 is for the GPU (the Gluon kernel on Hopper); 16 covers the graph on the CPU")
    if head_dim == 64:  # the Gluon kernel even at 37 tokens (it serves any length; on its own it starts at 2048)
        monkeypatch.setattr(fa, "GLUON_MIN_QUERIES", 0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    # the block's attention call: q [2, 4, 37, D], k and v [2, 2, 37, D] (grouped-query), causal
    probe_q, probe_k = (torch.empty(2, h, 37, head_dim, device=device, dtype=dtype) for h in (4, 2))
    reason = backend != "auto" and serve_reason(backend, *spec_of(probe_q, probe_k, None, True))
    if reason:
        pytest.skip(f"{backend} cannot serve here: {reason}")
    block = Block(dim=4 * head_dim, backend=backend).to(device, dtype).eval()
    xs = [torch.randn(2, 37, 4 * head_dim, device=device, dtype=dtype) for _ in range(3)]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.no_grad():
        eager = [block(x) for x in xs]
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(block)(xs[0])
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1
        before = dict(counters)
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, mode=mode)
        # under reduce-overhead the later calls replay a CUDA graph: new inputs must flow through it
        outs = [compiled(x).clone() for x in xs + xs]
    traced = {k[2] for k, c in counters.items() if k[:2] == ("attention", "compiled") and c > before.get(k, 0)}
    if backend != "auto":
        assert traced == {backend}
    elif mode == "reduce-overhead" and graphed_kernel_fits(probe_q):
        # replayed from CUDA graphs, a small attention on a GPU with a measured entry (ops/measured.py) is our kernel
        assert traced == {"triton"}
    else:  # torch's own SDPA in the graph: no in-graph measurement picks our kernel for attention here
        assert traced == {"sdpa"}
    for out, ref in zip(outs, eager + eager, strict=True):
        assert rel_err(out, ref) < tol


def test_attention_module_checks_its_arguments():
    with pytest.raises(UsageError, match="multiple of heads"):
        Attention(65, 4)
    with pytest.raises(UsageError, match="multiple of kv_heads"):
        Attention(64, 4, kv_heads=3)
    with pytest.raises(UsageError, match="layout='bsnd'"):
        Attention(64, 4, rope=RotaryEmbedding(16, layout="bnsd"))
    with pytest.raises(UsageError, match="backend must be"):
        Attention(64, 4, backend="nope")


def test_attention_module_matches_its_own_math():
    m = Attention(32, 4, kv_heads=2, bias=False).eval()
    x = torch.randn(3, 11, 32)
    mask = torch.rand(3, 1, 11, 11) < 0.8
    mask[..., 0] = True
    with torch.no_grad():
        q, k, v = m.qkv(x).split([32, 16, 16], dim=-1)
        q, k, v = q.unflatten(-1, (4, 8)), k.unflatten(-1, (2, 8)), v.unflatten(-1, (2, 8))
        ref = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), False, mask, 8**-0.5)
        expect = m.proj(ref.transpose(1, 2).flatten(2).float())
        assert rel_err(m(x, attn_mask=mask), expect) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_compiles_with_a_declared_dynamic_length_and_serves_new_lengths_without_recompiling(causal):
    def f(q, k, v):
        return attention(q, k, v, layout="bsnd", causal=causal)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="eager", dynamic=False)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for n in (37, 50, 129):
        q, k, v = (torch.randn(2, n, 4, 16) for _ in range(3))
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 1, min=2, max=512)
        out = compiled(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2).double() for t in (q, k, v)), is_causal=causal
        ).transpose(1, 2)
        assert rel_err(out, ref) < 1e-5
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames + 1  # one graph for every length
