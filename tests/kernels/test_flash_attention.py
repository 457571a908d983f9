import math

import pytest
import torch

import fullgraph.kernels.flash_attention as fa
from fullgraph import env
from fullgraph.errors import UsageError
from fullgraph.kernels.flash_attention import flash_attention_fwd  # importing registers the op
from tests.kernels.reference import rel_err
from tests.skips import requires_sm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Looser than the elementwise kernels' bounds: p is rounded to the input dtype before the p·v dot, and
# fp32 dots use input_precision="ieee" so no TF32 rounding enters on the GPU.
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def attention_ref(q, k, v, causal, scale):
    """softmax(q kᵀ · scale [+ causal mask]) v in float64, kv heads repeated for grouped-query attention."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def skip_bf16_on_cpu(device, dtype):
    if device == "cpu" and dtype == torch.bfloat16:
        # the interpreter keeps bf16 as uint16 bit patterns and tl.dot multiplies those (triton-lang/triton#11584)
        pytest.skip("tl.dot on bfloat16 is wrong under TRITON_INTERPRET; bf16 is tested on the GPU")


def qkv(device, dtype, b=1, hq=2, hkv=2, nq=77, nk=77, d=64):
    def draw(h, n):
        return torch.randn(b, h, n, d, device=device, dtype=dtype) * 1.5 + 0.2

    return draw(hq, nq), draw(hkv, nk), draw(hkv, nk)


def check(q, k, v, causal, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = flash_attention_fwd(q, k, v, causal, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert out.transpose(1, 2).is_contiguous()  # stored [B, N, H, D], whatever q's order
    assert out.stride() == fa._fake(q, k, v, causal, scale).stride()
    err = rel_err(out, attention_ref(q, k, v, causal, scale))
    assert err < TOL[q.dtype], f"relative error {err:.3e} over {TOL[q.dtype]:.1e} for {q.dtype}"
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("seq", [1, 77, 197, 1000])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64(triton_device, dtype, seq, head_dim, causal):
    skip_bf16_on_cpu(triton_device, dtype)
    if seq == 1000 and triton_device == "cpu":
        pytest.skip("1000 tokens take ~13 s a case in the interpreter (minutes for the set); run on the GPU")
    check(*qkv(triton_device, dtype, nq=seq, nk=seq, d=head_dim), causal)


@pytest.mark.parametrize("tma, ws", [(False, False), (True, False), (True, True)])
def test_every_kernel_variant(triton_device, monkeypatch, tma, ws):
    """Tensor-descriptor loads and a warp-specialized key loop are launch options: they must give the same
    numbers (TMA needs a Hopper GPU; elsewhere, and for unaligned strides, the launcher uses pointer loads)."""
    small = triton_device == "cpu"
    cfg = fa.Config(32, 16, 4, 1, tma, ws) if small else fa.Config(128, 128 if ws else 64, 4, 2 if ws else 3, tma, ws)
    monkeypatch.setattr(fa, "override", cfg)
    dtype = torch.float16
    # 128 keys fill whole key blocks: no masked tail loop (and the only loop is the warp-specialized one)
    cases = [(77, 77, 80, True, 1), (45, 130, 64, False, 2), (200, 200, 64, True, 2), (100, 128, 64, False, 2)]
    for nq, nk, d, causal, hkv in cases:
        check(*qkv(triton_device, dtype, b=2, hq=2, hkv=hkv, nq=nq, nk=nk, d=d), causal)
    check(*qkv(triton_device, dtype, nq=70, nk=70), causal=False, scale=-0.1)  # the max becomes a min
    check(*growing_logits(triton_device, dtype), causal=True)


def test_causal_calls_are_never_warp_specialized(triton_device, monkeypatch):
    """Triton 3.6 gave wrong causal outputs with warp specialization on the H200: even a configuration that asks
    for it must launch the plain loop when causal."""
    launched = []
    real = fa.launch

    class Recording:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(kwargs) or real(self.kernel)[grid](*args, **kwargs)

    monkeypatch.setattr(fa, "launch", Recording)
    monkeypatch.setattr(fa, "override", fa.Config(32, 16, 4, 1, True, True))
    for causal in (False, True):
        check(*qkv(triton_device, torch.float16, nq=64, nk=64), causal)
    assert [kw["WARP_SPECIALIZE"] for kw in launched] == [True, False]


@pytest.mark.parametrize(
    "causal, n_k, tma, device, measured, expected",
    [
        (False, 4096, True, "cuda", True, True),
        (True, 4096, True, "cuda", True, False),  # wrong outputs when causal
        (False, 4000, True, "cuda", True, False),  # a partial key block: every block masked, slower
        (False, 4096, False, "cuda", True, False),  # no tensor descriptors
        (False, 4096, True, "cuda", False, False),  # another GPU generation or an older Triton
        (False, 4096, True, "cpu", True, False),
    ],
)
def test_the_warp_specialized_tile_serves_only_where_measured(
    monkeypatch, causal, n_k, tma, device, measured, expected
):
    monkeypatch.setattr(fa, "_ws_measured", lambda capability: measured)
    assert fa._ws_fits(causal, n_k, tma, torch.device(device)) is expected


def test_ws_measured_needs_hopper_and_triton_3_6(monkeypatch):
    fa._ws_measured.cache_clear()
    monkeypatch.setattr(fa.env, "triton_version", lambda: "3.6.0")
    try:
        assert fa._ws_measured((9, 0)) and not fa._ws_measured((10, 0)) and not fa._ws_measured(None)
        fa._ws_measured.cache_clear()
        monkeypatch.setattr(fa.env, "triton_version", lambda: "3.5.1")
        assert not fa._ws_measured((9, 0))
    finally:
        fa._ws_measured.cache_clear()


GLUON = fa.Config(128, 128, 8, 2, gluon=True)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({}, ""),
        ({"on_hopper": False}, "Hopper GPUs only"),
        ({"triton": (3, 5)}, "triton >= 3.6"),
        ({"scale": -0.1}, "positive scale"),
        ({"tma_fits": False}, "16-byte aligned"),
        ({"cfg": GLUON._replace(num_warps=4)}, "BLOCK_M must be 16 · num_warps"),
        ({"cfg": GLUON._replace(ws=True)}, "BLOCK_M must be 16 · num_warps · 2"),
        ({"d": 80}, "head dim 64 or 128"),
        ({"dtype": torch.float32}, "float16 or bfloat16"),
    ],
)
def test_the_gluon_variant_says_what_it_cannot_serve(monkeypatch, change, reason):
    triton = change.pop("triton", (3, 6))
    monkeypatch.setattr(fa.env, "triton_at_least", lambda *version: triton >= version)
    args = {"scale": 0.1, "cfg": GLUON, "tma_fits": True, "on_hopper": True}
    q = torch.empty(1, 2, 64, change.pop("d", 128), dtype=change.pop("dtype", torch.bfloat16))
    args.update(change)
    got = fa._gluon_refusal(q, **args)
    assert (reason in got) if reason else got == ""


def test_an_unservable_gluon_request_is_a_clear_error(triton_device, monkeypatch):
    monkeypatch.setattr(fa, "override", GLUON)
    q, k, v = qkv(triton_device, torch.float16, nq=128, nk=128)
    reason = "it needs a positive scale" if fa._on_hopper(q.device) else "it runs on Hopper GPUs only"
    with pytest.raises(UsageError, match=f"the Gluon variant cannot serve these inputs: {reason}"):
        flash_attention_fwd(q, k, v, False, -0.1)


GLUON_WS = fa.Config(128, 128, 4, 2, ws=True, gluon=True)


@requires_sm(9)
@pytest.mark.parametrize(
    "cfg", [GLUON, fa.Config(64, 64, 4, 3, gluon=True), GLUON_WS, fa.Config(128, 64, 4, 4, ws=True, gluon=True)]
)
def test_the_gluon_variant_matches_float64(monkeypatch, cfg):
    """Every case runs and the failures are summarized together: the first GPU run of this kernel should say where
    it goes wrong (which warp group's rows, how many key blocks against ring slots, masked or not)."""
    if env.cuda_capability()[0] != 9:
        pytest.skip("the Gluon variant uses Hopper's wgmma")
    monkeypatch.setattr(fa, "override", cfg)
    cases = [(2, 3, 3, 256, 256, 128, False), (1, 4, 2, 200, 333, 128, False), (1, 2, 1, 77, 128, 64, False),
             (1, 2, 2, 128, 64 * 5, 128, False), (2, 3, 3, 256, 256, 128, True), (1, 4, 2, 300, 300, 128, True),
             (1, 2, 1, 77, 77, 64, True)]  # fmt: skip
    failures = []
    for dtype in (torch.bfloat16, torch.float16):
        for b, hq, hkv, nq, nk, d, causal in cases:  # whole and partial key blocks, GQA, MQA, the causal diagonal
            q, k, v = qkv("cuda", dtype, b=b, hq=hq, hkv=hkv, nq=nq, nk=nk, d=d)
            out = flash_attention_fwd(q, k, v, causal, 1 / math.sqrt(d))
            failures += _gluon_failure(out, attention_ref(q, k, v, causal, 1 / math.sqrt(d)), nk, cfg, dtype, causal)
    # repeated at a DiT-like length: a race between the asynchronous products and the loads shows as an occasional
    # wrong block
    q, k, v = qkv("cuda", torch.bfloat16, hq=8, hkv=8, nq=4096, nk=4096, d=128)
    for causal in (False, True):
        ref = attention_ref(q, k, v, causal, 0.088)
        for _ in range(10):
            out = flash_attention_fwd(q, k, v, causal, 0.088)
            failures += _gluon_failure(out, ref, 4096, cfg, torch.bfloat16, causal)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "head_dim, n_q, want",
    [(128, 4096, fa.GLUON_TILE), (128, 2048, fa.GLUON_TILE), (64, 16384, fa.Config(64, 128, 4, 2, gluon=True)),
     (128, 2047, None), (64, 197, None)],
)  # fmt: skip
def test_config_takes_the_gluon_tile_only_where_gluon_serves_and_pays(monkeypatch, head_dim, n_q, want):
    """`want` None: a sequence too short for the Gluon kernel to pay, where the Triton kernel's tile is used."""
    monkeypatch.setattr(fa.env, "triton_interpret", lambda: False)
    got = fa.config(head_dim, torch.bfloat16, n_q, 24, True, True, True)
    assert got == want if want else not got.gluon
    assert not fa.config(head_dim, torch.bfloat16, n_q, 24, True, True, False).gluon
    tile = fa.gluon_tile(head_dim)
    assert fa._gluon_refusal(torch.empty(1, 1, n_q, head_dim, dtype=torch.bfloat16), 0.1, tile, True, True) == ""


@pytest.mark.parametrize("batch, block_m", [(1, 64), (4, 64), (10, 64), (11, 128), (256, 128)])
def test_short_rows_take_64_query_tiles_only_on_a_small_grid(monkeypatch, batch, block_m):
    # ViT-B/16: 197 tokens, 12 heads, head dim 64; 128-query tiles give 2 programs per (image, head), so from
    # 11 images on the grid holds SMALL_GRID programs (264)
    monkeypatch.setattr(fa.env, "triton_interpret", lambda: False)
    assert fa.config(64, torch.bfloat16, 197, batch * 12).block_m == block_m
    assert fa.config(64, torch.bfloat16, 1024, batch * 12) == fa.Config(64, 64, 4, 3)  # long rows: unchanged


@pytest.fixture
def as_on_hopper(monkeypatch):
    """The launcher believes it runs on an aligned Hopper GPU; the Gluon launches it decides on are recorded."""
    launches = []
    monkeypatch.setattr(fa.env, "triton_interpret", lambda: False)
    monkeypatch.setattr(fa, "_on_hopper", lambda device: True)
    monkeypatch.setattr(fa, "_tma_fits", lambda *tensors: True)
    monkeypatch.setattr(fa, "_launch_gluon", lambda q, k, v, out, causal, scale, cfg: launches.append(cfg) or out)
    return launches


@pytest.mark.parametrize("d, dtype, gluon", [(128, torch.bfloat16, True), (64, torch.float16, True),
                                             (80, torch.bfloat16, False), (128, torch.float32, False)])  # fmt: skip
def test_on_hopper_the_launcher_runs_gluon_where_it_serves(as_on_hopper, d, dtype, gluon):
    n = fa.GLUON_MIN_QUERIES
    q, k, v = qkv("cpu", dtype, nq=n, nk=n, d=d)
    if not gluon:  # the Triton kernel would run: nothing to launch on this machine, only the decision matters
        assert fa._gluon_refusal(q, 0.1, fa.gluon_tile(d), True, True) != ""
        return
    flash_attention_fwd.launcher(q, k, v, False, 0.1)
    assert as_on_hopper == [fa.gluon_tile(d)]


def test_a_traced_call_records_the_gluon_kernel_as_an_opaque_op(as_on_hopper):
    """Inductor builds only plain Triton kernels: where the launcher picks Gluon, the traced graph must call
    fullgraph.flash_attention_gluon with the chosen tile, and nothing launches while tracing."""
    from torch.fx.experimental.proxy_tensor import make_fx

    n = fa.GLUON_MIN_QUERIES + 77
    q, k, v = qkv("cpu", torch.bfloat16, hq=4, hkv=2, nq=n, nk=n, d=128)
    graph = make_fx(lambda q, k, v: flash_attention_fwd.launcher(q, k, v, True, 0.1), tracing_mode="fake")(q, k, v)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "flash_attention_gluon" in str(n.target)]
    assert len(calls) == 1 and as_on_hopper == []
    assert calls[0].args[3:] == (True, 0.1, [int(x) for x in fa.GLUON_TILE])
    assert calls[0].meta["val"].shape == q.shape and calls[0].meta["val"].dtype == q.dtype


def test_the_opaque_gluon_op_falls_back_to_the_triton_kernel_where_gluon_cannot_serve(triton_device):
    """At run time (here: no Hopper GPU, or a view TMA cannot address) the op runs the Triton kernel instead."""
    q, k, v = qkv(triton_device, torch.float16, hq=4, hkv=2, nq=77, nk=77, d=64)
    out = torch.ops.fullgraph.flash_attention_gluon(q, k, v, True, 0.125, [int(x) for x in fa.gluon_tile(64)])
    if fa._on_hopper(q.device):
        pytest.skip("on Hopper this runs the Gluon kernel: test_the_gluon_variant_matches_float64 covers it")
    assert rel_err(out, attention_ref(q, k, v, True, 0.125)) < TOL[torch.float16]


def _gluon_failure(out, ref, n_k, cfg, dtype, causal) -> list[str]:
    """[] when out matches; else one line: the error, NaNs, and the rows that are off by warp group."""
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if err < TOL[dtype]:
        return []
    row_err = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)).flatten(0, 1)  # [B·H, Nq]
    bad = (row_err > TOL[dtype]) | ~torch.isfinite(row_err)
    rows = bad.nonzero()[:, 1]
    groups = sorted({int(r) % cfg.block_m // 64 for r in rows})
    blocks = sorted({int(r) // cfg.block_m for r in rows})[:8]
    return [
        f"{tuple(out.shape)} keys {n_k} causal={causal} {dtype}: relative error {err:.2e}, "
        f"NaN={bool(out.isnan().any())}, {int(bad.sum())} bad rows in warp groups {groups}, query blocks {blocks}"
    ]


def test_the_gluon_failure_summary_names_the_wrong_warp_group():
    ref = torch.randn(1, 2, 300, 64, dtype=torch.float64)
    assert _gluon_failure(ref.float(), ref, 300, GLUON, torch.bfloat16, False) == []
    out = ref.clone()
    out[0, 1, 128 + 70] += 5.0  # a row of the second warp group of query block 1
    out[0, 0, 256 + 3] = float("nan")  # a row of the first warp group of query block 2
    (line,) = _gluon_failure(out, ref, 300, GLUON, torch.bfloat16, False)
    assert "NaN=True, 2 bad rows in warp groups [0, 1], query blocks [1, 2]" in line


@pytest.mark.parametrize("dtype", DTYPES)
def test_fewer_queries_than_keys(triton_device, dtype):
    skip_bf16_on_cpu(triton_device, dtype)
    check(*qkv(triton_device, dtype, nq=77, nk=130, d=80), causal=False)
    check(*qkv(triton_device, dtype, nq=130, nk=45, d=64), causal=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [2, 1])
def test_grouped_query_heads(triton_device, hkv, causal):
    q, k, v = qkv(triton_device, torch.float16, b=2, hq=4, hkv=hkv, nq=45, nk=45)
    out = check(q, k, v, causal)
    if hkv == 2:
        # query head 1 reads kv head 0 and head 2 reads kv head 1: a kernel mapping h to h % Hkv would fail here
        assert rel_err(out[:, 1], attention_ref(q[:, 1:2], k[:, :1], v[:, :1], causal, 1 / 8)[:, 0]) < 2e-3


def test_strided_inputs(triton_device):
    b, n, h, d = 2, 45, 2, 64
    # [B, N, H, D] views as [B, H, N, D]: used in place with their own strides
    q, k, v = (torch.randn(b, n, h, d, device=triton_device, dtype=torch.float16).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    check(q, k, v, causal=True)
    # a fused QKV projection's output [B, N, 3, H, D]: q, k, v views
    qkv_out = torch.randn(b, n, 3, h, d, device=triton_device, dtype=torch.float16)
    check(*qkv_out.permute(2, 0, 3, 1, 4), causal=False)
    # a channel stride of 2 cannot be used in place: copied first
    q2 = torch.randn(b, h, n, 2 * d, device=triton_device, dtype=torch.float16)[..., ::2]
    assert q2.stride(-1) == 2
    check(q2, k, v, causal=False)


def growing_logits(device, dtype):
    q, k, v = qkv(device, dtype, nq=130, nk=130)
    # logits in the hundreds, larger for later keys: the running max rises block after block, so every
    # block must rescale l and the accumulator (exp of unrescaled logits would also overflow fp32)
    growth = torch.linspace(1, 3, k.shape[2], device=device)[:, None]
    return (q.float() * 8).to(dtype), (k.float() * 8 * growth).to(dtype), v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_grow_along_the_keys(triton_device, dtype, causal):
    skip_bf16_on_cpu(triton_device, dtype)
    check(*growing_logits(triton_device, dtype), causal)


def test_every_element_written(triton_device, monkeypatch):
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    # tail query rows (77 is no multiple of the blocks) and padded channels (80 -> 128): a missed row or
    # column stays NaN; a store past D would clobber the next row and fail the comparison
    out = check(*qkv(triton_device, torch.float32, b=2, nq=77, nk=77, d=80), causal=True)
    assert torch.isfinite(out).all()


def test_no_keys_gives_zeros(triton_device):
    q, k, v = qkv(triton_device, torch.float32, nq=5, nk=0)
    out = flash_attention_fwd(q, k, v, False, 0.125)
    assert torch.equal(out, attention_ref(q, k, v, False, 0.125).float())


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck(triton_device, causal):
    q, k, v = qkv(triton_device, torch.float16, hq=4, hkv=2, nq=33, nk=33)
    torch.library.opcheck(torch.ops.fullgraph.flash_attention.default, (q, k, v, causal, 0.125))


def _bad_inputs(device):
    q, k, v = qkv(device, torch.float16, hq=4, hkv=2, nq=8, nk=8)
    q3, k3, v3 = qkv(device, torch.float16, hq=3, hkv=2, nq=8, nk=8)
    _, k9, v9 = qkv(device, torch.float16, hq=4, hkv=2, nq=8, nk=9)
    wide = qkv(device, torch.float16, nq=8, nk=8, d=264)
    return {
        "mixed dtypes": ((q, k.float(), v, False), "dtype"),
        "unsupported dtype": ((q.double(), k.double(), v.double(), False), "dtype"),
        "heads not a multiple": ((q3, k3, v3, False), "heads"),
        "k/v shapes differ": ((q, k, v9, False), "k and v"),
        "causal with Nq != Nk": ((q, k9, v9, True), "causal"),
        "head dim over 256": ((*wide, False), "head dim"),
        "not 4-D": ((q[0], k[0], v[0], False), "q must be"),
        "k batch differs": ((q, k[:1].expand(2, -1, -1, -1), v[:1].expand(2, -1, -1, -1), False), "batch"),
        "k head dim differs": ((q, k[..., :32], v[..., :32], False), "head dim"),
        "batch x heads over the grid": (
            (*qkv(device, torch.float16, b=65536, hq=1, hkv=1, nq=1, nk=1, d=16), False),
            "grid",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "mixed dtypes",
        "unsupported dtype",
        "heads not a multiple",
        "k/v shapes differ",
        "causal with Nq != Nk",
        "head dim over 256",
        "not 4-D",
        "k batch differs",
        "k head dim differs",
        "batch x heads over the grid",
    ],
)
def test_bad_inputs_raise(triton_device, case):
    args, words = _bad_inputs(triton_device)[case]
    with pytest.raises(UsageError, match=words) as info:
        flash_attention_fwd(*args, 0.125)
    assert isinstance(info.value, ValueError)
