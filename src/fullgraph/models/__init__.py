"""Reference models built from `fullgraph.ops`, each with a plain-PyTorch twin to measure against (DESIGN.md:
models import ops only; compiling is applied from outside)."""

from fullgraph.models.dit import CONFIGS as DIT_CONFIGS
from fullgraph.models.dit import DiT, DiTConfig, PlainDiT, dit
from fullgraph.models.nms import BatchedNMS, NMSOutput, nms
from fullgraph.models.vit import CONFIGS as VIT_CONFIGS
from fullgraph.models.vit import (
    AutoDrivingViT,
    PlainViT,
    ViT,
    ViTConfig,
    load_timm_state_dict,
    vit_b16,
    vit_l16,
    vit_small,
    vit_tiny,
)

__all__ = [
    "DIT_CONFIGS",
    "VIT_CONFIGS",
    "AutoDrivingViT",
    "BatchedNMS",
    "DiT",
    "DiTConfig",
    "NMSOutput",
    "PlainDiT",
    "PlainViT",
    "ViT",
    "ViTConfig",
    "dit",
    "load_timm_state_dict",
    "nms",
    "vit_b16",
    "vit_l16",
    "vit_small",
    "vit_tiny",
]
