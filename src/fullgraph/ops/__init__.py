"""Compile-aware ops: each has a pure-PyTorch form and a Triton kernel registered as a torch op.

Which one runs is a policy (`policies.py`): per instance, per op class (`set_policy`), in a block
(`with policy(rms_norm="kernel"):`), or from FULLGRAPH_OPS.
"""

# Importing the op modules registers the kernel ops (torch.ops.fullgraph.*): that needs neither Triton
# nor a GPU; a kernel is built on its first call.
from fullgraph.ops import policies as _policies
from fullgraph.ops.attention import Attention, attention, attention_choice
from fullgraph.ops.attention_backends import register_ops
from fullgraph.ops.custom_op import CustomOp
from fullgraph.ops.linear import LinearGELU, linear_gelu, skinny_linear
from fullgraph.ops.modulation import GatedResidual, Modulate, gated_residual, layer_norm_modulate, modulate
from fullgraph.ops.norms import LayerNorm, RMSNorm, layer_norm, rms_norm
from fullgraph.ops.policies import Policy, counters, policy, set_policy
from fullgraph.ops.rope import RotaryEmbedding, apply_rope, qk_norm_rope, rope_tables

_policies.check_env()

__all__ = [
    "Attention",
    "CustomOp",
    "GatedResidual",
    "LayerNorm",
    "LinearGELU",
    "Modulate",
    "Policy",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rope",
    "attention",
    "attention_choice",
    "counters",
    "gated_residual",
    "layer_norm",
    "layer_norm_modulate",
    "linear_gelu",
    "modulate",
    "policy",
    "qk_norm_rope",
    "register_ops",
    "rms_norm",
    "rope_tables",
    "set_policy",
    "skinny_linear",
]
