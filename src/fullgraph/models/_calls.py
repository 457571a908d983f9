"""What the models' cross-module shortcuts ask before they call a block in an unusual way.

The ViT runs its last block for the class token alone, and the DiT carries each block's last residual into the next
block's first norm: both call a block with arguments of their own. Tools that watch or replace a block expect its
usual call: a forward hook (profilers; regional AOT's export probe), an instance forward (regional AOT's package
runner, nested compile regions, a user's patch), a per-block compile (which would compile the unusual call as a
second graph, a recompile). Where one is there, the model calls the block as usual.
"""

from __future__ import annotations

from torch import nn


def must_call_as_usual(block: nn.Module) -> bool:
    """Does something watch or replace `block`'s call, so that the model must call it as usual (see above)?"""
    return bool(
        block._forward_pre_hooks
        or block._forward_hooks
        or "forward" in block.__dict__
        or block._compiled_call_impl is not None
    )
