"""upcast_torchvision_roi_align: bf16 RoI Align pooled in float32 and cast back, against a float64 reference; the
swap reaches the modules that bound the name and is undone on exit. CPU: a stand-in kernel that, like torchvision's,
has no bf16; CUDA with torchvision: torchvision's own kernel at random shapes."""

import sys
import types

import pytest
import torch

from fullgraph.errors import UsageError
from fullgraph.models.roi_align import upcast_torchvision_roi_align, upcasting
from tests.skips import requires_cuda


def kernel_without_bf16(input, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False):
    """A dtype-faithful stand-in: the mean of each box's feature window at integer coordinates, in the input's
    dtype; fails on bf16 as torchvision's kernels do."""
    if input.dtype == torch.bfloat16:
        raise NotImplementedError("\"roi_align_forward_kernel\" not implemented for 'BFloat16'")
    rows = (
        boxes
        if isinstance(boxes, torch.Tensor)
        else torch.cat([torch.cat([torch.full_like(b[:, :1], i), b], 1) for i, b in enumerate(boxes)])
    )
    assert rows.dtype == input.dtype  # torchvision's kernels want boxes in the input's dtype
    out = []
    for r in rows.tolist():
        x1, y1, x2, y2 = (int(v * spatial_scale) for v in r[1:])
        window = input[int(r[0]), :, y1 : y2 + 1, x1 : x2 + 1]
        out.append(window.mean((1, 2))[:, None, None].expand(-1, *output_size))
    return torch.stack(out)


def random_rois(g, n, images, size, dtype):
    xy = torch.randint(0, size - 4, (n, 2), generator=g)
    wh = torch.randint(1, 4, (n, 2), generator=g)
    return torch.cat([torch.randint(0, images, (n, 1), generator=g), xy, xy + wh], 1).to(dtype)


@pytest.mark.parametrize("as_list", [False, True])
def test_bf16_is_pooled_in_float32_and_rounded_once(seed, as_list):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 13, 11, generator=g).bfloat16()
    rois = random_rois(g, 7, 2, 11, torch.bfloat16)
    boxes = [rois[rois[:, 0] == i, 1:] for i in range(2)] if as_list else rois
    with pytest.raises(NotImplementedError, match="BFloat16"):
        kernel_without_bf16(x, boxes, (2, 3))
    out = upcasting(kernel_without_bf16)(x, boxes, (2, 3), spatial_scale=1.0)
    order = torch.cat([torch.nonzero(rois[:, 0] == i)[:, 0] for i in range(2)]) if as_list else torch.arange(7)
    reference = kernel_without_bf16(x.double(), rois[order].double(), (2, 3))
    assert out.dtype == torch.bfloat16 and out.shape == (7, 5, 2, 3)
    torch.testing.assert_close(out.double(), reference, rtol=2**-8, atol=1e-6)  # one bf16 rounding of the mean


def test_other_dtypes_pass_through_untouched():
    seen = []

    def kernel(input, boxes, *args, **kwargs):
        seen.append((input.dtype, boxes.dtype))
        return input.sum()

    x, boxes = torch.randn(1, 2, 4, 4, dtype=torch.float16), torch.tensor([[0.0, 0, 0, 2, 2]], dtype=torch.float16)
    assert upcasting(kernel)(x, boxes, (1, 1)).dtype == torch.float16
    assert seen == [(torch.float16, torch.float16)]


def test_the_swap_reaches_modules_that_bound_the_name_and_is_undone(monkeypatch):
    package, ops, module, poolers = (types.ModuleType(n) for n in ("torchvision", "torchvision.ops",
                                     "torchvision.ops.roi_align", "torchvision.ops.poolers"))  # fmt: skip
    for m in (package, ops, module, poolers):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    module.roi_align = ops.roi_align = poolers.roi_align = kernel_without_bf16  # as torchvision re-exports it
    with pytest.raises(RuntimeError, match="inside"), upcast_torchvision_roi_align():
        assert module.roi_align is ops.roi_align is poolers.roi_align is not kernel_without_bf16
        x = torch.randn(1, 3, 6, 6).bfloat16()
        assert poolers.roi_align(x, torch.tensor([[0.0, 1, 1, 3, 3]]).bfloat16(), (1, 1)).dtype == torch.bfloat16
        raise RuntimeError("inside")  # restored on the way out of an error too
    assert module.roi_align is ops.roi_align is poolers.roi_align is kernel_without_bf16


def test_without_torchvision_is_a_clear_error(monkeypatch):
    for name in ("torchvision", "torchvision.ops", "torchvision.ops.roi_align"):
        monkeypatch.setitem(sys.modules, name, None)
    needs = r"upcast_torchvision_roi_align\(\) needs torchvision"
    with pytest.raises(UsageError, match=needs), upcast_torchvision_roi_align():
        pass


@requires_cuda
def test_torchvision_roi_align_in_bf16_on_cuda_against_float64(seed):
    tv = pytest.importorskip("torchvision")
    g = torch.Generator().manual_seed(seed)
    for case in range(20):
        images, c, h, w = 1 + case % 3, 3 + case % 5, 17 + case, 23 - case % 7
        x = torch.randn(images, c, h, w, generator=g).bfloat16().cuda()
        rois = random_rois(g, 1 + case * 3, images, min(h, w), torch.float32).cuda() * 1.37  # fractional boxes
        rois[:, 0] = rois[:, 0].div(1.37).round()
        kwargs = {"spatial_scale": 0.5 + case % 2 * 0.5, "sampling_ratio": case % 3 - 1, "aligned": case % 2 == 0}
        with pytest.raises((NotImplementedError, RuntimeError), match="BFloat16"):
            tv.ops.roi_align(x, rois.bfloat16(), (3, 4), **kwargs)
        with upcast_torchvision_roi_align():
            out = tv.ops.roi_align(x, rois.bfloat16(), (3, 4), **kwargs)
        reference = tv.ops.roi_align(x.double(), rois.bfloat16().double(), (3, 4), **kwargs)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.double(), reference, rtol=2**-8, atol=1e-5)
