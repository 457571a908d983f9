"""Compile-aware ops: each has a pure-PyTorch form and a Triton kernel registered as a torch op.

Which one runs is a policy (`policies.py`): per instance, per op class (`set_policy`), in a block
(`with policy(rms_norm="kernel"):`), or from FULLGRAPH_OPS.
"""

# Importing the op modules registers the kernel ops (torch.ops.fullgraph.*): that needs neither Triton
# nor a GPU; a kernel is built on its first call.
from fullgraph.ops import policies as _policies
from fullgraph.ops.custom_op import CustomOp
from fullgraph.ops.norms import LayerNorm, RMSNorm, layer_norm, rms_norm
from fullgraph.ops.policies import Policy, counters, policy, set_policy

_policies.check_env()

__all__ = [
    "CustomOp",
    "LayerNorm",
    "Policy",
    "RMSNorm",
    "counters",
    "layer_norm",
    "policy",
    "rms_norm",
    "set_policy",
]
