"""Reference models built from `fullgraph.ops`, each with a plain-PyTorch twin to measure against (DESIGN.md:
models import ops only; compiling is applied from outside)."""

from fullgraph.models.dit import CONFIGS as DIT_CONFIGS
from fullgraph.models.dit import DiT, DiTConfig, PlainDiT, dit
from fullgraph.models.nms import BatchedNMS, NMSOutput, batched_nms, nms, replace_torchvision_nms
from fullgraph.models.robot import CONFIGS as ROBOT_CONFIGS
from fullgraph.models.robot import RobotConfig, RobotModel, dynamic_spec, recommended_plan, robot, robot_tiny
from fullgraph.models.roi_align import upcast_torchvision_roi_align
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
    "ROBOT_CONFIGS",
    "VIT_CONFIGS",
    "AutoDrivingViT",
    "BatchedNMS",
    "DiT",
    "DiTConfig",
    "NMSOutput",
    "PlainDiT",
    "PlainViT",
    "RobotConfig",
    "RobotModel",
    "ViT",
    "ViTConfig",
    "batched_nms",
    "dit",
    "dynamic_spec",
    "load_timm_state_dict",
    "nms",
    "recommended_plan",
    "replace_torchvision_nms",
    "robot",
    "robot_tiny",
    "upcast_torchvision_roi_align",
    "vit_b16",
    "vit_l16",
    "vit_small",
    "vit_tiny",
]
