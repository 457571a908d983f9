"""A Vision Transformer (ViT, Dosovitskiy et al. 2020) built from `fullgraph.ops`, its plain-PyTorch twin, timm's
weights, and the chapter's `AutoDrivingViT`.

The computation is timm's `VisionTransformer` with a class token (`vit_base_patch16_224` and its siblings):

    t = patch_embed(img)                                   # [B, N, D], N = (H / p)·(W / p), row-major over the grid
    x = cat(cls_token, t) + pos_embed                      # [B, 1 + N, D]
    x = x + attn.proj(attention(attn.qkv(norm1(x))))       # each block, pre-norm, fused QKV
    x = x + mlp.fc2(gelu(mlp.fc1(norm2(x))))
    logits = head(norm(x)[:, 0])                           # [B, num_classes]

`ViT` writes the patch embedding as the GEMM it is: the image is cut into patches by a reshape and a permute
([B, C, H, W] -> [B, N, C·p·p]) and multiplied by an `nn.Linear`, instead of a p×p stride-p convolution (which on
the GPU costs a convolution kernel plus an NCHW->NHWC conversion, several times the GEMM's time at batch 256). The
norms are `ops.LayerNorm` and attention is `ops.Attention`, so each op's policy picks native or kernel. `PlainViT`
is the same model the way timm and users write it (convolution, `nn.LayerNorm`, SDPA).

Parameter names are timm's, so timm's state dict loads as it is; the one difference is the patch-embedding weight,
[D, C·p·p] here and [D, C, p, p] in a convolution: both forms load into both models (reshaped on load).
This module imports `ops` only (DESIGN.md, Layers): compile it from outside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fullgraph import ops
from fullgraph.errors import UsageError
from fullgraph.models._calls import must_call_as_usual
from fullgraph.ops import direct, measured


@dataclass(frozen=True)
class ViTConfig:
    """A ViT's shape. `img_size`: the input's (height, width) (an int for a square), each a multiple of `patch`;
    `gelu`: "erf" (exact, timm's `nn.GELU`) or "tanh" (the approximation, fusable as a GEMM epilogue);
    `num_classes=0` leaves the head out (the model returns the class token's features)."""

    dim: int = 768
    depth: int = 12
    heads: int = 12
    patch: int = 16
    img_size: int | tuple[int, int] = 224
    in_chans: int = 3
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    eps: float = 1e-6  # timm's LayerNorm eps for ViT
    gelu: str = "erf"

    def __post_init__(self) -> None:
        size = (self.img_size, self.img_size) if isinstance(self.img_size, int) else tuple(self.img_size)
        object.__setattr__(self, "img_size", size)  # always (H, W) from here on
        if self.dim <= 0 or self.heads <= 0 or self.dim % self.heads:
            raise UsageError(f"dim ({self.dim}) must be a positive multiple of heads ({self.heads})")
        if self.depth < 1:
            raise UsageError(f"depth must be at least 1, got {self.depth}")
        if self.patch < 1 or len(size) != 2 or min(size) < self.patch or size[0] % self.patch or size[1] % self.patch:
            raise UsageError(f"img_size {size} must be (H, W), each a positive multiple of patch ({self.patch})")
        if self.in_chans < 1 or self.num_classes < 0 or self.hidden < 1:
            raise UsageError(
                f"in_chans ({self.in_chans}) and mlp hidden width ({self.hidden}) must be positive, "
                f"num_classes ({self.num_classes}) at least 0"
            )
        if self.gelu not in ("erf", "tanh"):
            raise UsageError(f"gelu={self.gelu!r}: choose 'erf' (exact, timm's) or 'tanh'")

    @property
    def grid(self) -> tuple[int, int]:
        """Patches along (height, width)."""
        return self.img_size[0] // self.patch, self.img_size[1] // self.patch

    @property
    def tokens(self) -> int:
        """The sequence length: the class token and one token per patch."""
        return 1 + self.grid[0] * self.grid[1]

    @property
    def hidden(self) -> int:
        return int(self.dim * self.mlp_ratio)


CONFIGS = {  # timm's vit_{tiny,small,base,large}_patch16_224
    "vit_tiny": ViTConfig(dim=192, depth=12, heads=3),
    "vit_small": ViTConfig(dim=384, depth=12, heads=6),
    "vit_b16": ViTConfig(dim=768, depth=12, heads=12),
    "vit_l16": ViTConfig(dim=1024, depth=24, heads=16),
}


def config(name: str, **overrides) -> ViTConfig:
    """A named config (vit_tiny, vit_small, vit_b16, vit_l16) with fields replaced, e.g. config("vit_b16", depth=2)."""
    if name not in CONFIGS:
        raise UsageError(f"unknown ViT config {name!r}; choose one of {', '.join(CONFIGS)}")
    fields = {f: getattr(CONFIGS[name], f) for f in ViTConfig.__dataclass_fields__}
    return ViTConfig(**{**fields, **overrides})


def _reshape_on_load(state_dict: dict, key: str, shape: torch.Size) -> None:
    """Give `state_dict[key]` the shape `shape` when it holds the same weight in the other layout ([D, C·p·p] for a
    GEMM, [D, C, p, p] for a convolution); any other mismatch is left for load_state_dict to report."""
    w = state_dict.get(key)
    if isinstance(w, torch.Tensor) and w.shape != shape and w.shape[0] == shape[0] and w.numel() == shape.numel():
        state_dict[key] = w.reshape(shape)


class PatchEmbed(nn.Module):
    """Image [B, C, H, W] -> tokens [B, N, D]: non-overlapping p×p patches, unfolded in (C, p, p) order, times a
    [D, C·p·p] weight (a conv weight flattened), one GEMM. Loads a conv weight [D, C, p, p] as well."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.patch = cfg.patch
        self.proj = self.make_proj(cfg)

    @staticmethod
    def make_proj(cfg: ViTConfig) -> nn.Module:
        return nn.Linear(cfg.in_chans * cfg.patch**2, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)  # x: [B, H/p, W/p, C, p, p]
        return self.proj(x.reshape(b, (h // p) * (w // p), c * p * p))  # [B, N, C·p·p] -> [B, N, D]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _reshape_on_load(state_dict, prefix + "proj.weight", self.proj.weight.shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class PlainPatchEmbed(PatchEmbed):
    """The p×p stride-p convolution, as timm writes it; loads a GEMM weight [D, C·p·p] as well."""

    @staticmethod
    def make_proj(cfg: ViTConfig) -> nn.Module:
        return nn.Conv2d(cfg.in_chans, cfg.dim, cfg.patch, stride=cfg.patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, D, H/p, W/p] -> [B, N, D]


class Mlp(nn.Module):
    """fc2(gelu(fc1(x))), timm's names; fc1 and the GELU are `ops.linear_gelu` (one GEMM with the tanh GELU in its
    epilogue where that op's policy takes the kernel form; the exact GELU always runs as its own pass)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.approximate = "tanh" if cfg.gelu == "tanh" else "none"  # fixed here, a constant to torch.compile
        self.fc1 = nn.Linear(cfg.dim, cfg.hidden)
        self.fc2 = nn.Linear(cfg.hidden, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(ops.linear_gelu(x, self.fc1.weight, self.fc1.bias, self.approximate))


class PlainMlp(Mlp):
    """`Mlp` written the usual way: `F.gelu(fc1(x))`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class PlainAttention(nn.Module):
    """Fused QKV, SDPA, output projection: `ops.Attention`'s parameters (timm's), written the usual way."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)  # q: [B, H, N, D]
        a = F.scaled_dot_product_attention(q, k, v)  # a: [B, H, N, D]
        return self.proj(a.transpose(1, 2).flatten(2))


class Block(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)): `fullgraph.ops` LayerNorm and Attention."""

    norm_cls: type[nn.Module] = ops.LayerNorm
    attn_cls: type[nn.Module] = ops.Attention
    mlp_cls: type[nn.Module] = Mlp

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.norm1 = self.norm_cls(cfg.dim, eps=cfg.eps)
        self.attn = self.attn_cls(cfg.dim, cfg.heads)
        self.norm2 = self.norm_cls(cfg.dim, eps=cfg.eps)
        self.mlp = self.mlp_cls(cfg)

    def forward(self, x: torch.Tensor, first_only: bool = False) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]; with `first_only`, the output of the first (class) token alone, [B, 1, D]: every
        token still feeds attention as a key and a value, but only the first is queried and carried through the
        projection and the MLP (what a classifier reads from the last block, for about a quarter of its GEMM work)."""
        n1, n2, attn, mlp = self.norm1, self.norm2, self.attn, self.mlp
        policy = n1.policy
        plain = _plain_attention(attn)
        if not direct.usable() or n2.policy != policy or not plain:
            if first_only and plain:  # the checked ops (autograd records), the first token's rows only
                q, k, v = _qkv(attn, n1(x), first_only)
                x = x[:, :1] + attn.proj(ops.attention(q, k, v, layout="bsnd").flatten(2))
                return x + mlp(n2(x))
            x = x + attn(n1(x))  # x: [B, 1 + N, D]; the checked ops (autograd records, or a customized block)
            x = x + mlp(n2(x))
            return x[:, :1] if first_only else x
        # Inference: each op's form chosen once per block and called without per-op checks (`ops.direct`: less
        # host time eager, fewer guards compiled), computing what the modules above compute.
        own, shape = (("layer_norm", policy),) if policy else (), measured.shape_of(x, attn.head_dim, len(n1.weight))
        f = direct.direct(x.device, x.numel(), _CALLS, own, shape)
        q, k, v = _qkv(attn, f.layer_norm(x, n1.weight, n1.bias, n1.eps), first_only)
        # q: [B, 1 + N, H, D], or [B, 1, H, D] with first_only; k, v: [B, 1 + N, H, D]
        x = (x[:, :1] if first_only else x) + attn.proj(f.attention(q, k, v).flatten(2))
        h = f.layer_norm(x, n2.weight, n2.bias, n2.eps)
        return x + mlp.fc2(f.linear_gelu(h, mlp.fc1.weight, mlp.fc1.bias, mlp.approximate))


def _qkv(attn: nn.Module, h: torch.Tensor, first_only: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [B, T, H, D] from the fused QKV projection; with `first_only`, q for h's first token alone,
    [B, 1, H, D]. The GEMM stays whole even then (one launch; the T - 1 other queries are a ninth of the block's GEMM
    work, and two GEMMs cost a launch more where a small batch is launch-bound)."""
    q, k, v = attn.qkv(h).unflatten(-1, (3, attn.heads, -1)).unbind(2)
    return (q[:, :1] if first_only else q), k, v


_CALLS = "layer_norm:2,linear_gelu:1"  # a block's calls of each op, for `ops.direct`'s counts


def _plain_attention(attn: nn.Module) -> bool:
    """Is `attn` an `ops.Attention` as the block builds it (what the direct path computes): no norm, RoPE or pin?
    (A subclass's own attention module, as the robot's vision blocks have, runs as it is.)"""
    if not isinstance(attn, ops.Attention):
        return False
    plain_qk = isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)
    return (
        plain_qk
        and isinstance(attn.rope, nn.Identity)
        and attn.backend is None
        and not attn.causal
        and (attn.kv_heads == attn.heads)
    )


class PlainBlock(Block):
    """`Block` with `nn.LayerNorm`, `PlainAttention` and `PlainMlp`."""

    norm_cls = nn.LayerNorm
    attn_cls = PlainAttention
    mlp_cls = PlainMlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))  # x: [B, 1 + N, D]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """The ViT built from `fullgraph.ops`. forward(img [B, C, H, W]) -> logits [B, num_classes]
    (the class token's features [B, dim] with num_classes=0); `forward_features` -> [B, 1 + N, dim] after the final
    norm, the class token first, then the patches row-major over `cfg.grid`."""

    patch_embed_cls: type[nn.Module] = PatchEmbed
    block_cls: type[nn.Module] = Block
    norm_cls: type[nn.Module] = ops.LayerNorm

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = self.patch_embed_cls(cfg)
        self.cls_token = nn.Parameter(torch.empty(1, 1, cfg.dim))
        self.pos_embed = nn.Parameter(torch.empty(1, cfg.tokens, cfg.dim))
        self.blocks = nn.ModuleList(self.block_cls(cfg) for _ in range(cfg.depth))
        self.norm = self.norm_cls(cfg.dim, eps=cfg.eps)
        self.head = nn.Linear(cfg.dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        nn.init.normal_(self.cls_token, std=1e-6)  # timm's initialisation of the two
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward_features(self, img: torch.Tensor) -> torch.Tensor:
        x = self._tokens(img)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        """Logits from the class token. Its row is all the head reads, and each token's norm and MLP are its own, so
        the last block computes that row alone (`Block.forward(first_only=True)`: the other tokens only as keys and
        values): the same logits as `head(forward_features(img)[:, 0])`, with about a quarter of that block's GEMMs."""
        x = self._tokens(img)
        for block in self.blocks[:-1]:
            x = block(x)
        last = self.blocks[-1]  # watched or replaced (`must_call_as_usual`): every token computed, the first kept
        x = last(x)[:, :1] if must_call_as_usual(last) else last(x, first_only=True)
        return self.head(self.norm(x)[:, 0])

    def _tokens(self, img: torch.Tensor) -> torch.Tensor:
        """The class token and the embedded patches, position embedding added: [B, 1 + N, D]."""
        self._check(img)
        t = self.patch_embed(img)  # t: [B, N, D]
        return torch.cat((self.cls_token.expand(t.shape[0], -1, -1), t), dim=1) + self.pos_embed

    def _check(self, img: torch.Tensor) -> None:
        c, (h, w) = self.cfg.in_chans, self.cfg.img_size
        if img.ndim != 4 or img.shape[1] != c or tuple(img.shape[2:]) != (h, w):
            raise UsageError(
                f"img must be [B, {c}, {h}, {w}] (this ViT's in_chans and img_size), got {tuple(img.shape)}; "
                "build the model with the image size you run"
            )


class PlainViT(ViT):
    """The same ViT in plain PyTorch (convolution, `nn.LayerNorm`, SDPA); loads `ViT`'s state dicts and timm's."""

    patch_embed_cls = PlainPatchEmbed
    block_cls = PlainBlock
    norm_cls = nn.LayerNorm

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(img)[:, 0])  # as timm: every token through every block


class AutoDrivingViT(ViT):
    """The chapter's driving-perception ViT (section 2.5.4): one backbone, two outputs.

    In training mode it returns class logits [B, num_classes] from the class token; in eval mode (inference) it
    returns the patch features [B, N, dim] after the final norm, for a detection head: the class token is dropped,
    and `.unflatten(1, cfg.grid)` gives the [B, H/p, W/p, dim] map. (The chapter returns the class token too; a
    detection head wants the patches alone.) The head is not run in eval. `training` is fixed per call, so a
    compiled model guards on it: switching modes recompiles once per mode, then never again.
    Default: vit_b16 with the chapter's 10 classes.
    """

    def __init__(self, cfg: ViTConfig | None = None):
        super().__init__(cfg if cfg is not None else config("vit_b16", num_classes=10))

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(img)  # x: [B, 1 + N, D]
        return self.head(x[:, 0]) if self.training else x[:, 1:]


def load_timm_state_dict(model: ViT, state_dict: Mapping[str, torch.Tensor] | nn.Module) -> ViT:
    """Load timm's `VisionTransformer` weights (a state dict, or the timm model itself) into `model`, so that it
    gives timm's outputs: the names are the same and the conv patch weight is reshaped; every tensor must fit
    (build the model with timm's img_size, patch and num_classes). Returns `model`."""
    if isinstance(state_dict, nn.Module):
        state_dict = state_dict.state_dict()
    ours = model.state_dict()
    missing = sorted(ours.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - ours.keys())
    if missing or unexpected:
        raise UsageError(
            f"not a timm ViT state dict for this model: missing {missing[:5]}, unexpected {unexpected[:5]} "
            f"({len(missing)} and {len(unexpected)} in all); only the class-token ViTs without fc_norm load"
        )
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:  # shapes: img_size (pos_embed), num_classes (head), dim
        raise UsageError(f"timm weights do not fit {model.cfg}: {e}") from e
    return model


def build(name: str = "vit_b16", plain: bool = False, **overrides) -> ViT:
    """`build("vit_b16", depth=2)`: a ViT (or, with plain=True, its plain-PyTorch twin) from a named config."""
    cfg = config(name, **overrides)
    return PlainViT(cfg) if plain else ViT(cfg)


def vit_tiny(plain: bool = False, **overrides) -> ViT:
    """ViT-Ti/16: dim 192, 12 blocks, 3 heads (timm's vit_tiny_patch16_224)."""
    return build("vit_tiny", plain, **overrides)


def vit_small(plain: bool = False, **overrides) -> ViT:
    """ViT-S/16: dim 384, 12 blocks, 6 heads (timm's vit_small_patch16_224)."""
    return build("vit_small", plain, **overrides)


def vit_b16(plain: bool = False, **overrides) -> ViT:
    """ViT-B/16: dim 768, 12 blocks, 12 heads (timm's vit_base_patch16_224)."""
    return build("vit_b16", plain, **overrides)


def vit_l16(plain: bool = False, **overrides) -> ViT:
    """ViT-L/16: dim 1024, 24 blocks, 16 heads (timm's vit_large_patch16_224)."""
    return build("vit_l16", plain, **overrides)
