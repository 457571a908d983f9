"""TARGET for `fullgraph doctor`: timm's ViT-B/16 (random weights), the chapter's case study.

fullgraph doctor benchmarks/targets/vit.py:vit_b16 --input 1x3x224x224:fp32
"""

import torch


def vit_b16():
    try:
        import timm
    except ImportError as e:
        raise RuntimeError("this target needs timm: pip install timm") from e
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    return model, torch.randn(1, 3, 224, 224)
