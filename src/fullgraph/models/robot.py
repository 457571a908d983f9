"""The chapter's robot model (exercise 2.7): a camera image of variable resolution and a point cloud of a variable
number of points in, a fixed-size action vector out, built from `fullgraph.ops`, with the per-module compile plan
the exercise asks for as plain data.

    v = vision(image)             # [B, C, H, W] -> [B, vision_dim]: ViT blocks over (H/p)·(W/p) patches, mean-pooled
    q = points(points)            # [B, N, point_feats] -> [B, point_widths[-1]]: PointNet shared MLP, max over N
    f = fusion(v, q)              # [B, vision_dim + point_widths[-1]]: concatenation and a LayerNorm
    a = head(f)                   # [B, actions]: MLP, tanh (actions bounded in [-1, 1])

The chapter's names are `vision_encoder`, `pointcloud_processor`, `fusion` and `control_head`; here they are
`vision`, `points`, `fusion` and `head`, the paths `fullgraph.compile`'s plans and docs use.

Compile-friendly by construction for shapes that change on every request: the patch embedding is `Tensor.unfold`
(a view; a reshape by H/p would make the compiler prove H divisible by p, a guard a declared range cannot carry)
followed by one GEMM; the position embedding is factorized (NaViT's choice for variable resolution): a learned
row table [H_max/p, dim] and column table [W_max/p, dim], cropped and summed on the grid (a cropped 2-D table would
make the compiler ask whether the crop is contiguous, i.e. whether W is the largest width); the pools (mean over
patches, max over points) give fixed sizes whatever H, W and N are. The checks that need a size's
value (ranges, divisibility by the patch) run in `RobotModel.forward`, which a plan leaves eager (compiled whole,
divisibility goes unchecked: see `check_inputs`); each encoder checks only what its compiled graph keeps static
(ranks, channel and feature counts).

This module imports `ops` only (DESIGN.md, Layers): `recommended_plan(cfg)` returns the plan as preset names and
declared ranges, and the caller passes it on: `fullgraph.compile(model, plan=recommended_plan(model.cfg))`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from fullgraph import ops
from fullgraph.errors import UsageError
from fullgraph.models.vit import Block, PlainAttention, ViTConfig

Range = tuple[int, int]


def _range(value: Any, what: str) -> Range:
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise UsageError(f"{what}={value!r}: give (min, max), two ints")
    lo, hi = value
    if not 0 < lo <= hi:
        raise UsageError(f"{what}=({lo}, {hi}): need 0 < min <= max")
    return lo, hi


@dataclass(frozen=True)
class RobotConfig:
    """The robot model's shape and the input ranges it serves (both ends inclusive).

    `height`, `width`: image sizes, multiples of `patch`, at least two patches each (a one-patch side would make
    the compiled graph specialize that size); `num_points`: points per cloud, at least 2 (Dynamo specializes sizes
    0 and 1). `actions`: the control vector's width (7: a 6-DoF arm and a gripper)."""

    in_chans: int = 3
    patch: int = 16
    height: Range = (96, 480)
    width: Range = (128, 640)
    vision_dim: int = 384
    vision_depth: int = 4
    vision_heads: int = 6
    mlp_ratio: float = 4.0
    point_feats: int = 3  # xyz; 6 for xyz + rgb
    num_points: Range = (512, 16384)
    point_widths: tuple[int, ...] = (64, 128, 512)
    head_hidden: int = 256
    actions: int = 7
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("height", "width", "num_points"):
            object.__setattr__(self, name, _range(getattr(self, name), name))
        object.__setattr__(self, "point_widths", tuple(self.point_widths))
        p = self.patch
        for name in ("height", "width"):
            lo, hi = getattr(self, name)
            if p < 1 or lo % p or hi % p or lo < 2 * p:
                raise UsageError(f"{name}=({lo}, {hi}): both ends must be multiples of patch ({p}), at least {2 * p}")
        if self.num_points[0] < 2:
            raise UsageError(f"num_points={self.num_points}: at least 2 points (Dynamo specializes sizes 0 and 1)")
        counts = {"in_chans": self.in_chans, "point_feats": self.point_feats, "vision_depth": self.vision_depth,
                  "head_hidden": self.head_hidden, "actions": self.actions}  # fmt: skip
        bad = [f"{k}={v}" for k, v in counts.items() if v < 1]
        if bad or not self.point_widths or min(self.point_widths) < 1:
            raise UsageError(f"{', '.join(bad) or f'point_widths={self.point_widths}'}: sizes must be positive")
        if self.vision_dim < 1 or self.vision_heads < 1 or self.vision_dim % self.vision_heads:
            raise UsageError(f"vision_dim ({self.vision_dim}) must be a positive multiple of vision_heads "
                             f"({self.vision_heads})")  # fmt: skip

    @property
    def max_grid(self) -> tuple[int, int]:
        """Patches along (height, width) at the largest image."""
        return self.height[1] // self.patch, self.width[1] // self.patch

    @property
    def feature_dim(self) -> int:
        """The fused feature's width: vision_dim + point_widths[-1]."""
        return self.vision_dim + self.point_widths[-1]

    def vit(self) -> ViTConfig:
        """The `ViTConfig` of the vision encoder's blocks (tanh GELU: fusable into fc1's GEMM)."""
        return ViTConfig(dim=self.vision_dim, depth=self.vision_depth, heads=self.vision_heads, patch=self.patch,
                         img_size=(self.height[1], self.width[1]), in_chans=self.in_chans, mlp_ratio=self.mlp_ratio,
                         num_classes=0, eps=self.eps, gelu="tanh")  # fmt: skip


CONFIGS = {
    "robot_tiny": RobotConfig(patch=8, height=(16, 64), width=(16, 64), vision_dim=32, vision_depth=2,
                              vision_heads=2, num_points=(8, 512), point_widths=(16, 32), head_hidden=32, actions=4),
    "robot_base": RobotConfig(),
}  # fmt: skip


def config(name: str, **overrides: Any) -> RobotConfig:
    """A named config (robot_tiny, robot_base) with fields replaced, e.g. config("robot_base", vision_depth=2)."""
    if name not in CONFIGS:
        raise UsageError(f"unknown robot config {name!r}; choose one of {', '.join(CONFIGS)}")
    base = {f.name: getattr(CONFIGS[name], f.name) for f in fields(RobotConfig)}
    return RobotConfig(**{**base, **overrides})


def _check_rank(t: Any, name: str, ndim: int, shape: str) -> None:
    if not isinstance(t, torch.Tensor) or t.ndim != ndim or not t.is_floating_point():
        got = f"{t.ndim}-D {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise UsageError(f"{name} must be a {ndim}-D float tensor {shape}, got {got}")


class VisionBlock(Block):
    """`fullgraph.models.vit.Block` (ops.LayerNorm, the MLP's fc1 + GELU as `ops.linear_gelu`) with SDPA attention
    in place of `ops.Attention`, same parameters: `ops.attention` cannot trace a symbolic sequence length yet (its
    backend choice passes the length to an `assume_constant_result` function, so `fullgraph=True` fails and
    plain compile breaks the graph in every block), and the patch count changes with the resolution here."""

    attn_cls = PlainAttention


class VisionEncoder(nn.Module):
    """Image [B, C, H, W] -> feature [B, vision_dim] for any H, W in the config's ranges.

    Non-overlapping p×p patches by `unfold` (a view), flattened in (C, p, p) order and projected by one GEMM; plus
    the position of each patch, row table [:H/p] + column table [:W/p]; pre-norm ViT blocks (`VisionBlock`); the
    final norm's output averaged over the patches."""

    def __init__(self, cfg: RobotConfig):
        super().__init__()
        vit = cfg.vit()
        self.patch, self.in_chans = cfg.patch, cfg.in_chans
        self.proj = nn.Linear(cfg.in_chans * cfg.patch**2, cfg.vision_dim)
        self.pos_rows = nn.Parameter(torch.empty(cfg.max_grid[0], cfg.vision_dim))
        self.pos_cols = nn.Parameter(torch.empty(cfg.max_grid[1], cfg.vision_dim))
        self.blocks = nn.ModuleList(VisionBlock(vit) for _ in range(cfg.vision_depth))
        self.norm = ops.LayerNorm(cfg.vision_dim, eps=cfg.eps)
        nn.init.trunc_normal_(self.pos_rows, std=0.02)
        nn.init.trunc_normal_(self.pos_cols, std=0.02)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        _check_rank(image, "image", 4, "[B, C, H, W]")
        if image.shape[1] != self.in_chans:
            raise UsageError(f"image has {image.shape[1]} channels; this model takes {self.in_chans}")
        p = self.patch
        x = image.unfold(2, p, p).unfold(3, p, p)  # x: [B, C, H/p, W/p, p, p]
        b, c, gh, gw = x.shape[:4]
        x = self.proj(x.permute(0, 2, 3, 1, 4, 5).reshape(b, gh, gw, c * p * p))  # x: [B, H/p, W/p, dim]
        x = x + self.pos_rows[:gh, None] + self.pos_cols[:gw]  # rows [H/p, 1, dim], columns [W/p, dim]
        x = x.flatten(1, 2)  # x: [B, N, dim], N = (H/p)·(W/p), row-major over the grid
        for block in self.blocks:
            x = block(x)
        return self.norm(x).mean(1)  # [B, dim]


class PointEncoder(nn.Module):
    """Point cloud [B, N, point_feats] -> feature [B, point_widths[-1]] for any N (PointNet, Qi et al. 2017): the
    same MLP on every point (Linear + GELU per width, `ops.linear_gelu`), then the max over points, then a
    LayerNorm. The max makes it independent of the points' order and of N."""

    def __init__(self, cfg: RobotConfig):
        super().__init__()
        self.point_feats = cfg.point_feats
        widths = (cfg.point_feats, *cfg.point_widths)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.norm = ops.LayerNorm(widths[-1], eps=cfg.eps)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        _check_rank(points, "points", 3, "[B, N, point_feats]")
        if points.shape[2] != self.point_feats:
            raise UsageError(f"points have {points.shape[2]} features each; this model takes {self.point_feats}")
        x = points
        for layer in self.layers:
            x = ops.linear_gelu(x, layer.weight, layer.bias, "tanh")  # x: [B, N, width]
        return self.norm(x.amax(1))  # [B, point_widths[-1]]


class Fusion(nn.Module):
    """(vision [B, Dv], points [B, Dp]) -> [B, Dv + Dp]: concatenation and a LayerNorm, so neither modality's scale
    dominates the head. The chapter leaves this step eager (its plan entry is "eager")."""

    def __init__(self, cfg: RobotConfig):
        super().__init__()
        self.norm = ops.LayerNorm(cfg.feature_dim, eps=cfg.eps)

    def forward(self, vision: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.cat((vision, points), -1))


class ControlHead(nn.Module):
    """Fused feature [B, feature_dim] -> actions [B, actions] in [-1, 1]: Linear, GELU, Linear, tanh."""

    def __init__(self, cfg: RobotConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.feature_dim, cfg.head_hidden)
        self.fc2 = nn.Linear(cfg.head_hidden, cfg.actions)

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc2(ops.linear_gelu(feature, self.fc1.weight, self.fc1.bias, "tanh")))


class RobotModel(nn.Module):
    """forward(image [B, C, H, W], points [B, N, point_feats]) -> actions [B, actions].

    H and W must lie in `cfg.height` and `cfg.width` and be multiples of `cfg.patch`; N in `cfg.num_points`; both
    inputs float on one batch size. Checked here (eagerly under a plan), before any part runs."""

    def __init__(self, cfg: RobotConfig | None = None):
        super().__init__()
        self.cfg = cfg if cfg is not None else RobotConfig()
        self.vision = VisionEncoder(self.cfg)
        self.points = PointEncoder(self.cfg)
        self.fusion = Fusion(self.cfg)
        self.head = ControlHead(self.cfg)

    def forward(self, image: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        self.check_inputs(image, points)
        return self.head(self.fusion(self.vision(image), self.points(points)))

    def check_inputs(self, image: torch.Tensor, points: torch.Tensor) -> None:
        """A UsageError naming the first input outside what this model serves."""
        cfg = self.cfg
        _check_rank(image, "image", 4, "[B, C, H, W]")
        _check_rank(points, "points", 3, "[B, N, point_feats]")
        b, c, h, w = image.shape
        if c != cfg.in_chans:
            raise UsageError(f"image has {c} channels; this model takes {cfg.in_chans}")
        p = cfg.patch
        for name, size, (lo, hi) in (("height", h, cfg.height), ("width", w, cfg.width)):
            # Divisibility is checked eagerly only: traced, it is a guard (torch._check too) that not every size of
            # a declared range passes, so Dynamo refuses to compile; compiled whole, a remainder of fewer than p
            # rows or columns is dropped, as a stride-p convolution drops it. Under a plan this method runs eagerly.
            if not lo <= size <= hi or (not torch.compiler.is_compiling() and size % p):
                raise UsageError(f"image {name} {size} is outside the declared range ({lo}, {hi}) or not a multiple "
                                 f"of the patch ({p}); resize the image or build the model for it")  # fmt: skip
        n, feats = points.shape[1:]
        if feats != cfg.point_feats:
            raise UsageError(f"points have {feats} features each; this model takes {cfg.point_feats}")
        if not cfg.num_points[0] <= n <= cfg.num_points[1]:
            raise UsageError(f"{n} points is outside the declared range {cfg.num_points}; subsample or pad the "
                             "cloud (repeat a point: the max-pool ignores duplicates)")  # fmt: skip
        if points.shape[0] != b:
            raise UsageError(f"image batch {b} and points batch {points.shape[0]} differ")


def dynamic_spec(cfg: RobotConfig) -> dict[str, dict[int, Range]]:
    """The config's ranges as declared dims of `RobotModel.forward`'s inputs, `{input: {dim: (min, max)}}`: image
    H and W (dims 2 and 3), the number of points (dim 1). For a whole-model compile,
    `fullgraph.compile(model, dynamic=dynamic_spec(cfg))`; the encoders name their inputs the same way, so
    `recommended_plan` reuses these entries per part."""
    return {"image": {2: cfg.height, 3: cfg.width}, "points": {1: cfg.num_points}}


def recommended_plan(cfg: RobotConfig) -> dict[str, Any]:
    """The exercise's per-module strategy as plain data for `fullgraph.compile(model, plan=...)`:

    - `vision`: preset "planning" with fullgraph=True and the image's H and W (dims 2 and 3 of the vision
      encoder's input `image`) declared dynamic over the config's ranges: one symbolic graph for every
      resolution (the chapter's `dynamic={"spatial": True}`, which is not an API: DESIGN.md, errata 3);
    - `points`: "planning", fullgraph=True, the number of points (dim 1 of `points`) declared over its range
      (the chapter's `dynamic=True`, narrowed to the one dim that changes; no max-autotune);
    - `fusion`: "eager", as the chapter leaves it;
    - `head`: "perception" (fixed shapes, fullgraph=True, CUDA graphs on a GPU: the chapter's reduce-overhead
      + `backend="cudagraphs"`, with Inductor's fusion kept). Its input has a fixed width, so it compiles once
      per batch size.

    Models do not import `fullgraph.compile` (DESIGN.md, Layers); this returns names and ranges only. A fresh
    dict each call: change an entry before passing it on, e.g. `plan["head"] = "planning"` on a CPU.
    """
    planning, spec = {"preset": "planning", "fullgraph": True}, dynamic_spec(cfg)
    return {
        "vision": {**planning, "dynamic": {"image": spec["image"]}},
        "points": {**planning, "dynamic": {"points": spec["points"]}},
        "fusion": "eager",
        "head": "perception",
    }


def example_inputs(cfg: RobotConfig, batch: int = 1, height: int | None = None, width: int | None = None,
                   num_points: int | None = None, *, generator: torch.Generator | None = None,
                   device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Random (image, points) of the given sizes (each defaults to its range's maximum)."""
    h, w, n = height or cfg.height[1], width or cfg.width[1], num_points or cfg.num_points[1]
    image = torch.randn(batch, cfg.in_chans, h, w, generator=generator).to(device, dtype)
    points = torch.randn(batch, n, cfg.point_feats, generator=generator).to(device, dtype)
    return image, points


def random_stream(cfg: RobotConfig, n: int, batch: int = 1, *, seed: int = 0, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """`n` random requests with H, W (multiples of the patch) and N drawn uniformly from the config's ranges."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int, step: int = 1) -> int:
        return step * int(torch.randint(lo // step, hi // step + 1, (), generator=g))

    requests = []
    for _ in range(n):
        h, w, points = draw(*cfg.height, cfg.patch), draw(*cfg.width, cfg.patch), draw(*cfg.num_points)
        requests.append(example_inputs(cfg, batch, h, w, points, generator=g, device=device, dtype=dtype))
    return requests


def robot(name: str = "robot_base", **overrides: Any) -> RobotModel:
    """`robot("robot_tiny")`: the robot model from a named config with fields replaced."""
    return RobotModel(config(name, **overrides))


def robot_tiny(**overrides: Any) -> RobotModel:
    """A 35k-parameter robot model for tests: 8×8 patches, images 16..64 a side, 8..512 points."""
    return robot("robot_tiny", **overrides)
