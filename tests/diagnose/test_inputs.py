import pytest
import torch

from fullgraph.diagnose.inputs import Example, flat_tensors
from fullgraph.errors import UsageError


def test_of_wraps_one_argument_and_keeps_keywords():
    x = torch.randn(3, 4)
    assert Example.of(x).args == (x,)
    images = [torch.randn(3, 5, 7), torch.randn(3, 6, 4)]
    ex = Example.of((images,), {"threshold": 0.5})
    assert ex.args == (images,) and ex.kwargs == {"threshold": 0.5}
    assert ex.call(lambda imgs, threshold: (len(imgs), threshold)) == (2, 0.5)
    with pytest.raises(UsageError, match="dict of name"):
        Example.of((x,), [1, 2])


def test_cast_touches_floating_tensors_only():
    ids = torch.randint(0, 100, (2, 9))
    ex = Example.of(([torch.randn(3, 4), ids], 0.25), {"mask": torch.rand(2, 9) > 0.5, "h": torch.randn(2, 3)})
    cast = ex.cast(torch.bfloat16)
    (images, t), kw = cast.args, cast.kwargs
    assert images[0].dtype == torch.bfloat16 and images[1] is ids and t == 0.25
    assert kw["mask"].dtype == torch.bool and kw["h"].dtype == torch.bfloat16
    assert cast.floating_dtype() == torch.bfloat16 and ex.floating_dtype() == torch.float32


def test_vary_batch_moves_every_tensor_that_carries_it():
    ids, mask = torch.randint(5, 50, (2, 16)), torch.randint(0, 2, (2, 16))
    ex = Example.of((), {"input_ids": ids, "attention_mask": mask, "scale": 2.0})
    first, second = ex.vary("batch", 1), ex.vary("batch", 2)
    assert first.kwargs["input_ids"].shape == first.kwargs["attention_mask"].shape == (5, 16)
    assert second.kwargs["input_ids"].shape[0] not in (2, 5)  # a second new size
    new_ids = first.kwargs["input_ids"]
    assert new_ids.dtype == torch.int64 and new_ids.min() >= 5 and new_ids.max() <= ids.max()  # ids stay in range
    assert set(first.kwargs["attention_mask"].unique().tolist()) <= {0, 1}
    assert first.kwargs["scale"] == 2.0
    seq = ex.vary("seq")
    assert seq.kwargs["input_ids"].shape == (2, 33)


def test_vary_batch_of_a_list_of_images_grows_the_list():
    images = [torch.randn(3, 8, 8), torch.randn(3, 6, 10)]
    grown = Example.of((images,)).vary("batch")
    assert len(grown.args[0]) == 5 and grown.args[0][:2] == images
    assert all(t.dim() == 3 and t.shape[0] == 3 for t in grown.args[0])  # channels untouched


def test_vary_not_applicable_and_unknown():
    assert Example.of(torch.randn(7)).vary("seq") is None
    with pytest.raises(UsageError, match="choose from"):
        Example.of(torch.randn(7)).vary("dtype")


def test_describe_names_structure():
    ex = Example.of(([torch.randn(3, 4, 5)], 0.5), {"attention_mask": torch.ones(2, 9, dtype=torch.int64)})
    assert ex.describe() == ["list[1](3x4x5:float32)", "0.5", "attention_mask=2x9:int64"]
    assert Example.of(()).device == torch.device("cpu")


def test_flat_tensors_of_structured_outputs():
    a, b = torch.randn(2), torch.randn(3)
    flat = flat_tensors({"boxes": a, "rest": [b, 3, None, "label"]})  # a number is part of the output, as 0-d
    assert [t.shape for t in flat] == [a.shape, b.shape, ()] and flat[2].item() == 3

    class ModelOutputLike(dict):  # not a pytree node, but has to_tuple like transformers' ModelOutput
        def to_tuple(self):
            return tuple(self.values())

    out = flat_tensors(ModelOutputLike(logits=a))
    assert len(out) == 1 and out[0] is a
