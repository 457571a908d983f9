"""TARGETs for `fullgraph bench load` (issue 31's acceptance, `bash benchmarks/h200.sh load`): three served models
in bf16 with random weights, each returning (model, inputs).

fullgraph bench load benchmarks/targets/serve.py:vit_s16_b4 --threads 1,4,16 --seconds 10

The timm ones need timm (the GPU machine has it; CPU tests do not use this file).
"""

import torch

from fullgraph.models.dit import dit

DIT_TOKENS = 1024


def _timm(name: str, batch: int):
    try:
        import timm
    except ImportError as e:
        raise RuntimeError("this target needs timm: pip install timm") from e
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval().to(torch.bfloat16)
    return model, torch.randn(batch, 3, 224, 224, dtype=torch.bfloat16)


def vit_s16_b4():
    """timm ViT-S/16 at batch 4: small calls, where the host and the CUDA-graph replay's lock count most."""
    return _timm("vit_small_patch16_224", 4)


def vit_b16_b64():
    """timm ViT-B/16 at batch 64: calls long enough that the GPU, not the lock, sets the rate."""
    return _timm("vit_base_patch16_224", 64)


def dit_b_1024():
    """Our DiT (fullgraph.models.dit, config dit_b: dim 768, 12 heads, 12 blocks) on 1024 tokens, batch 1."""
    torch.manual_seed(0)
    model = dit("dit_b", max_tokens=DIT_TOKENS)
    with torch.no_grad():
        for p in model.parameters():  # adaLN-Zero starts at zero: random weights make the output check mean something
            p.normal_(0, 0.02)
    model = model.eval().to(torch.bfloat16)
    dim = model.cfg.dim
    return model, (torch.randn(1, DIT_TOKENS, dim, dtype=torch.bfloat16), torch.randn(1, dim, dtype=torch.bfloat16))


class _Mlp(torch.nn.Module):
    def __init__(self, width: int = 512, depth: int = 4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def mlp_cpu_32():
    """Four 512-wide linears at 32 rows in fp32: a ~1 ms call on a 2-core CPU, the CPU's stand-in for a host-bound
    package call (how threads share a package whose run holds or releases the GIL; `--device cpu`)."""
    torch.manual_seed(0)
    return _Mlp().eval(), torch.randn(32, 512)
