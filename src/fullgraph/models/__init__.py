"""Reference models built from `fullgraph.ops`, each with a plain-PyTorch twin to measure against (DESIGN.md:
models import ops only; compiling is applied from outside)."""

from fullgraph.models.dit import CONFIGS as DIT_CONFIGS
from fullgraph.models.dit import DiT, DiTConfig, PlainDiT, dit
from fullgraph.models.nms import BatchedNMS, NMSOutput, nms

__all__ = ["DIT_CONFIGS", "BatchedNMS", "DiT", "DiTConfig", "NMSOutput", "PlainDiT", "dit", "nms"]
