import pytest
import torch

import fullgraph.ops.rope  # noqa: F401  (registers torch.ops.fullgraph.rope, qk_norm_rope and their backwards)
from fullgraph.kernels.rope import qk_norm_rope_fwd, rope_fwd
from fullgraph.ops.rope import rope_tables
from tests.kernels.reference import REL_TOL, assert_close, poison_new_tensors, rel_err, rms_norm_ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = {"bnsd": 2, "bsnd": 1}


def rope_ref(x, cos, sin, interleaved, seq_dim):
    """The pairs spelled out as index lists, in float64."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    h = cos.shape[-1]
    if seq_dim == 1:
        cos, sin = cos[:, None], sin[:, None]
    a = torch.arange(0, 2 * h, 2) if interleaved else torch.arange(h)
    b = a + 1 if interleaved else a + h
    out = x.clone()
    out[..., a] = x[..., a] * cos - x[..., b] * sin
    out[..., b] = x[..., b] * cos + x[..., a] * sin
    return out


def make_x(b, h, n, d, layout, device, dtype=torch.float32):
    shape = (b, h, n, d) if layout == "bnsd" else (b, n, h, d)
    return torch.randn(shape, device=device, dtype=dtype) * 2 + 0.3


def make_tables(n, rotary_dim, device, dtype=torch.float32):
    """Random cos/sin, not unit pairs: a swapped or misindexed table cannot hide behind cos² + sin² = 1."""
    return tuple(torch.randn(n, rotary_dim // 2, device=device, dtype=dtype) for _ in range(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 7, 77])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 32), (64, 64), (80, 40), (80, 80), (128, 64), (128, 128)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_matches_float64(triton_device, interleaved, layout, head_dim, rotary_dim, seq, dtype):
    x = make_x(2, 3, seq, head_dim, layout, triton_device, dtype)
    cos, sin = make_tables(seq, rotary_dim, triton_device)
    out = rope_fwd(x, cos, sin, interleaved, LAYOUTS[layout])
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(out, rope_ref(x, cos, sin, interleaved, LAYOUTS[layout]), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pairings_differ(triton_device, layout):
    x = make_x(2, 3, 7, 64, layout, triton_device)
    cos, sin = make_tables(7, 64, triton_device)
    half = rope_fwd(x, cos, sin, False, LAYOUTS[layout])
    interleaved = rope_fwd(x, cos, sin, True, LAYOUTS[layout])
    assert rel_err(half, interleaved.double()) > 0.1


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_pass_through_channels_are_copied_exactly(triton_device, interleaved):
    x = make_x(2, 3, 7, 80, "bnsd", triton_device, torch.bfloat16)
    cos, sin = make_tables(7, 32, triton_device)
    out = rope_fwd(x, cos, sin, interleaved, 2)
    assert torch.equal(out[..., 32:], x[..., 32:])
    assert not torch.equal(out[..., :32], x[..., :32])


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_strided_inputs(triton_device, interleaved):
    # [B, N, H, D] as a transposed view of [B, H, N, D] storage (and the reverse): used in place
    for layout, storage in (("bsnd", (2, 3, 77, 64)), ("bnsd", (2, 77, 3, 64))):
        x = torch.randn(storage, device=triton_device, dtype=torch.float16).transpose(1, 2)
        assert not x.is_contiguous()
        cos, sin = make_tables(77, 48, triton_device)
        ref = rope_ref(x, cos, sin, interleaved, LAYOUTS[layout])
        assert_close(rope_fwd(x, cos, sin, interleaved, LAYOUTS[layout]), ref, torch.float16)
    # channels with a stride (copied first), and cos/sin rows sliced from wider tables
    x = torch.randn(2, 3, 64, 7, device=triton_device).transpose(-1, -2)
    wide = torch.randn(2, 7, 64, device=triton_device)
    cos, sin = wide[0, :, :24], wide[1, :, 8:32]
    out = rope_fwd(x, cos, sin, interleaved, 2)
    assert_close(out, rope_ref(x, cos, sin, interleaved, 2), torch.float32)


@pytest.mark.parametrize("table_dtype", [torch.float64, torch.bfloat16])
def test_table_dtypes(triton_device, table_dtype):
    x = make_x(2, 3, 7, 64, "bsnd", triton_device, torch.bfloat16)
    cos, sin = make_tables(7, 64, triton_device, table_dtype)
    assert_close(rope_fwd(x, cos, sin, True, 1), rope_ref(x, cos, sin, True, 1), torch.bfloat16)


def test_head_dim_256_with_real_tables(triton_device):
    x = make_x(1, 2, 77, 256, "bnsd", triton_device)
    cos, sin = (t.to(triton_device) for t in rope_tables(77, 256))
    out = rope_fwd(x, cos, sin, False, 2)
    assert_close(out, rope_ref(x, cos, sin, False, 2), torch.float32)
    # a rotation keeps each pair's length, so each head vector's norm
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_empty_sequence(triton_device):
    x = make_x(2, 3, 0, 64, "bnsd", triton_device)
    cos, sin = make_tables(0, 64, triton_device)
    assert rope_fwd(x, cos, sin, False, 2).shape == x.shape


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_opcheck(triton_device, interleaved, layout):
    x = make_x(2, 3, 7, 80, layout, triton_device, torch.bfloat16).requires_grad_()
    cos, sin = make_tables(7, 48, triton_device)
    torch.library.opcheck(torch.ops.fullgraph.rope.default, (x, cos, sin, interleaved, LAYOUTS[layout]))


def test_tolerances_are_tight_enough_to_catch_a_pairing_off_by_one(triton_device):
    # Rotating only the first 62 of 64 channels is a plausible bug; the check must see it.
    x = make_x(2, 3, 7, 64, "bnsd", triton_device)
    cos, sin = make_tables(7, 64, triton_device)
    out = rope_fwd(x, cos[:, :31].contiguous(), sin[:, :31].contiguous(), True, 2)
    assert rel_err(out, rope_ref(x, cos, sin, True, 2)) > REL_TOL[torch.float32] * 100


# ---- q/k RMSNorm + RoPE in one launch ------------------------------------------------------------------------------


def qk_ref(x, weight, eps, cos, sin, interleaved, seq_dim):
    """RMSNorm then RoPE, both in float64."""
    return rope_ref(rms_norm_ref(x, weight, eps), cos, sin, interleaved, seq_dim)


def make_qk(b, hq, hk, n, d, layout, device, dtype):
    """q and k with different heads, scales and offsets, so a swapped tensor, weight or eps shows."""
    return make_x(b, hq, n, d, layout, device, dtype), make_x(b, hk, n, d, layout, device, dtype) * 3 - 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 7, 33])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (80, 48), (128, 128), (128, 96)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_qk_norm_rope_matches_float64(triton_device, interleaved, layout, head_dim, rotary_dim, seq, dtype):
    q, k = make_qk(2, 3, 1, seq, head_dim, layout, triton_device, dtype)  # grouped: one k head for three q heads
    qw, kw = (torch.randn(head_dim, device=triton_device, dtype=dtype) for _ in range(2))
    cos, sin = make_tables(seq, rotary_dim, triton_device)
    q_out, k_out = qk_norm_rope_fwd(q, k, qw, kw, cos, sin, 1e-6, 1e-2, interleaved, LAYOUTS[layout])
    for out, x in ((q_out, q), (k_out, k)):
        assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_close(q_out, qk_ref(q, qw, 1e-6, cos, sin, interleaved, LAYOUTS[layout]), dtype)
    assert_close(k_out, qk_ref(k, kw, 1e-2, cos, sin, interleaved, LAYOUTS[layout]), dtype)


def test_qk_norm_rope_reads_q_and_k_as_views_of_a_qkv_projection(triton_device):
    # the DiT's q, k, v: unbound from a [B, N, 3, H, D] projection, strided [B, N, H, D] views; v is not touched
    qkv = torch.randn(2, 37, 3, 4, 64, device=triton_device, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    qw, kw = (torch.rand(64, device=triton_device) + 0.5 for _ in range(2))  # float32 weights on bf16 inputs
    cos, sin = (t.to(triton_device) for t in rope_tables(37, 64))
    before = v.clone()
    q_out, k_out = qk_norm_rope_fwd(q, k, qw, kw, cos, sin, 1e-6, 1e-6, False, 1)
    assert_close(q_out, qk_ref(q, qw, 1e-6, cos, sin, False, 1), torch.bfloat16)
    assert_close(k_out, qk_ref(k, kw, 1e-6, cos, sin, False, 1), torch.bfloat16)
    assert torch.equal(qkv[:, :, 2], before)


def test_qk_norm_rope_without_weights_and_with_more_k_rows_than_q_rows(triton_device):
    q, k = make_qk(1, 1, 5, 9, 48, "bnsd", triton_device, torch.float32)  # k's rows outnumber q's: grid by the larger
    cos, sin = make_tables(9, 32, triton_device)
    q_out, k_out = qk_norm_rope_fwd(q, k, None, None, cos, sin, 1e-6, 1e-6, True, 2)
    assert_close(q_out, qk_ref(q, None, 1e-6, cos, sin, True, 2), torch.float32)
    assert_close(k_out, qk_ref(k, None, 1e-6, cos, sin, True, 2), torch.float32)


def test_qk_norm_rope_normalizes_over_the_whole_head_not_the_rotary_part(triton_device):
    # the pass-through channels count in the mean square: norming only the rotated part is a plausible bug
    q, k = make_qk(1, 2, 2, 5, 80, "bsnd", triton_device, torch.float32)
    q[..., 40:] *= 10
    cos, sin = make_tables(5, 40, triton_device)
    q_out, _ = qk_norm_rope_fwd(q, k, None, None, cos, sin, 1e-6, 1e-6, False, 1)
    wrong = torch.cat((qk_ref(q[..., :40], None, 1e-6, cos, sin, False, 1), q[..., 40:].double()), -1)
    assert rel_err(q_out, wrong) > 0.5
    assert_close(q_out, qk_ref(q, None, 1e-6, cos, sin, False, 1), torch.float32)


def test_qk_norm_rope_empty_sequence(triton_device):
    q, k = make_qk(2, 3, 3, 0, 64, "bnsd", triton_device, torch.float32)
    cos, sin = make_tables(0, 64, triton_device)
    q_out, k_out = qk_norm_rope_fwd(q, k, None, None, cos, sin, 1e-6, 1e-6, False, 2)
    assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize("layout", LAYOUTS)
def test_qk_norm_rope_opcheck(triton_device, layout):
    q, k = make_qk(2, 3, 1, 7, 80, layout, triton_device, torch.bfloat16)
    qw, kw = (torch.randn(80, device=triton_device, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = make_tables(7, 48, triton_device)
    args = (
        q.requires_grad_(),
        k.requires_grad_(),
        qw.requires_grad_(),
        kw,
        cos,
        sin,
        1e-6,
        1e-5,
        True,
        LAYOUTS[layout],
    )
    torch.library.opcheck(torch.ops.fullgraph.qk_norm_rope.default, args)


# head dims of real models: the rotary pairs held as power-of-two pieces (36 pairs = 32 + 4 at head dim 72), each
# piece's a and b halves together; q and k as views of a [B, N, 3, H, D] projection (strides of D, not of 16)
@pytest.mark.parametrize("head_dim", [64, 72, 80, 88, 96, 112, 128])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_qk_norm_rope_at_every_head_dim(triton_device, monkeypatch, interleaved, head_dim):
    poison_new_tensors(monkeypatch)
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(2, 5, 3, 3, head_dim, device=triton_device, dtype=dtype) * 2 + 0.3
        q, k, _ = qkv.unbind(2)
        qw, kw = (torch.randn(head_dim, device=triton_device, dtype=dtype) for _ in range(2))
        cos, sin = make_tables(5, head_dim, triton_device)
        q_out, k_out = qk_norm_rope_fwd(q, k, qw, kw, cos, sin, 1e-6, 1e-5, interleaved, 1)
        assert_close(q_out, qk_ref(q, qw, 1e-6, cos, sin, interleaved, 1), dtype)
        assert_close(k_out, qk_ref(k, kw, 1e-5, cos, sin, interleaved, 1), dtype)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_partial_rotary_at_head_dim_72(triton_device, monkeypatch, interleaved):
    # 20 pairs (16 + 4) rotated, 32 channels passed through; plain RoPE and the fused norm
    poison_new_tensors(monkeypatch)
    x = make_x(2, 3, 5, 72, "bnsd", triton_device, torch.bfloat16)
    cos, sin = make_tables(5, 40, triton_device)
    assert_close(rope_fwd(x, cos, sin, interleaved, 2), rope_ref(x, cos, sin, interleaved, 2), torch.bfloat16)
    q_out, _ = qk_norm_rope_fwd(x, x, None, None, cos, sin, 1e-6, 1e-6, interleaved, 2)
    assert_close(q_out, qk_ref(x, None, 1e-6, cos, sin, interleaved, 2), torch.bfloat16)


@pytest.mark.parametrize("two", [False, True])
def test_no_two_outputs_the_kernel_may_write_are_one_tensor(triton_device, monkeypatch, two):
    """torch.compile's functional form of a Triton kernel clones each output the kernel may write; two such slots
    holding one tensor leave the op returning the clone the kernel never wrote (plain RoPE did so on the H100, where
    the compiled result was garbage). One-tensor RoPE must not name k's output slot, and must not pass its own
    output there."""
    import fullgraph.kernels.rope as rope_module

    launches = []
    real = rope_module.launch

    def recording(kernel):
        launcher = real(kernel)

        class Grid:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    launches.append((args, kwargs))
                    return launcher[grid](*args, **kwargs)

                return run

        return Grid()

    monkeypatch.setattr(rope_module, "launch", recording)
    x = make_x(1, 2, 5, 64, "bnsd", triton_device)
    cos, sin = make_tables(5, 64, triton_device)
    if two:
        w = torch.ones(64, device=triton_device)
        outs = qk_norm_rope_fwd(x, x.clone(), w, w, cos, sin, 1e-6, 1e-6, False, 2)
    else:
        outs = (rope_fwd(x, cos, sin, False, 2),)
    ((args, kwargs),) = launches
    qy, ky = args[4], args[5]
    assert kwargs["TWO"] is two
    assert qy is outs[0]
    if two:
        assert ky is outs[1] and ky is not qy
    else:  # k's output slot holds no output of this call at all, and the launch still rotates x
        assert all(ky is not o for o in outs)
        assert_close(outs[0], rope_ref(x, cos, sin, False, 2), torch.float32)
