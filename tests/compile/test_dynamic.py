"""Declared dynamic dims and Bucketed: graph counts under a counting backend or Inductor, outputs against eager."""

import random

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from fullgraph.compile.dynamic import Bucketed, check_buckets, declare_dynamic
from fullgraph.errors import UsageError


@pytest.fixture
def graphs():
    """A fresh Dynamo and a counting backend: each compiled graph appends its example input shapes."""
    torch._dynamo.reset()
    counters.clear()
    seen = []

    def backend(gm, example_inputs):
        seen.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return gm.forward

    backend.seen = seen
    yield backend
    torch._dynamo.reset()


def mlp(d_in=8, d_out=4):
    return nn.Sequential(nn.Linear(d_in, 16), nn.GELU(), nn.Linear(16, d_out)).eval()


class TwoHeads(nn.Module):
    """Per-row outputs and one reduction over the batch, which no slice can undo."""

    def __init__(self):
        super().__init__()
        self.body = mlp()

    def forward(self, x):
        y = self.body(x)
        return {"logits": y, "mean": y.mean(0)}


class MaskedAttention(nn.Module):
    """Single-head attention over the token dim (1): tokens mix, so padded tokens need the key mask."""

    def __init__(self, d=8):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x, attention_mask=None):
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each: [B, N, D]
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5  # [B, N, N]
        if attention_mask is not None:
            scores = scores.masked_fill(attention_mask[:, None, :] == 0, float("-inf"))
        return scores.softmax(-1) @ v


# Bucketed ------------------------------------------------------------------------------------------------------


def test_bucketed_compiles_once_per_bucket_and_matches_eager():
    """Issue 12's CPU acceptance: 50 random batch sizes in 1..32, Inductor with static shapes, 6 graphs in all."""
    torch._dynamo.reset()
    counters.clear()
    model = mlp()
    bucketed = Bucketed(torch.compile(model, dynamic=False))
    sizes = [1, 2, 3, 5, 9, 17, 31] + [random.randint(1, 32) for _ in range(43)]  # every bucket, odd sizes
    random.shuffle(sizes)
    with torch.no_grad():
        for n in sizes:
            x = torch.randn(n, 8)
            y = bucketed(x)
            assert y.shape == (n, 4)
            torch.testing.assert_close(y, model(x))
    assert {bucketed.bucket_for(n) for n in sizes} == set(bucketed.buckets)
    assert counters["stats"]["unique_graphs"] == 6
    torch._dynamo.reset()


def test_bucketed_from_range_and_bucket_for():
    assert Bucketed.from_range(mlp(), 0, (1, 32)).buckets == (1, 2, 4, 8, 16, 32)
    assert Bucketed.from_range(mlp(), 0, (3, 50)).buckets == (4, 8, 16, 32, 50)
    assert Bucketed.from_range(mlp(), 0, (5, 5)).buckets == (5,)
    b = Bucketed(mlp(), buckets=(2, 8, 24))
    assert [b.bucket_for(n) for n in (0, 1, 2, 3, 8, 9, 24)] == [2, 2, 2, 8, 8, 24, 24]
    assert "buckets=(2, 8, 24)" in repr(b)


def test_bucketed_pads_only_batch_inputs_and_keeps_structure(graphs):
    """Nested inputs are padded where they carry the batch; a tensor that does not pass unchanged."""

    def fn(batch, scale):
        return {"y": batch["a"] * scale + batch["b"][0], "n": batch["a"].shape[0]}

    b = Bucketed(torch.compile(fn, backend=graphs, dynamic=False), buckets=(4, 8), batch_args=("batch",))
    for n in (3, 5, 7, 2, 8):
        batch = {"a": torch.randn(n, 8), "b": [torch.randn(n, 1)]}
        scale = torch.randn(8)
        out = b(batch, scale)
        torch.testing.assert_close(out["y"], batch["a"] * scale + batch["b"][0])
        assert out["n"] == b.bucket_for(n)  # the model saw the padded size; non-tensor outputs pass through
    assert sorted({s[0][0] for s in graphs.seen}) == [4, 8]
    assert len(graphs.seen) == 2


def test_bucketed_rejects_an_output_that_is_not_batch_aligned():
    b = Bucketed(TwoHeads(), buckets=(4, 8))
    with pytest.raises(UsageError, match=r"output\['mean'\] has shape \(4,\), whose dim 0 is not the padded size 8"):
        b(torch.randn(5, 8))
    kept = Bucketed(TwoHeads(), buckets=(4, 8), batch_outputs=["output['logits']"], check_padding=False)
    out = kept(torch.randn(5, 8))
    assert out["logits"].shape == (5, 4) and out["mean"].shape == (4,)
    with pytest.raises(UsageError, match=r"batch_outputs names 'output\[0\]', not an output; outputs: output\['logits"):
        Bucketed(TwoHeads(), buckets=(8,), batch_outputs=["output[0]"])(torch.randn(5, 8))


def test_bucketed_mask_keeps_padding_out_of_attention(graphs):
    """Bucketing the token dim: with mask_arg the padded keys are masked, so real tokens match the unpadded run."""
    model = MaskedAttention().eval()
    compiled = torch.compile(model, backend=graphs, dynamic=False)
    b = Bucketed(compiled, dim=1, buckets=(4, 8, 16), mask_arg="attention_mask")
    with torch.no_grad():
        for n in (5, 11, 3, 16):
            x = torch.randn(2, n, 8)
            torch.testing.assert_close(b(x), model(x))  # mask omitted: Bucketed passes ones, zero over padding
            mask = (torch.rand(2, n) > 0.3).long()
            mask[:, 0] = 1  # every query keeps one key
            torch.testing.assert_close(b(x, mask), model(x, mask))
    assert len(graphs.seen) == 3  # buckets 4, 8 and 16; the padding check compiled nothing


def test_bucketed_padding_check_names_the_leaking_output():
    with pytest.raises(UsageError, match=r"output changes with the padding values .* pass mask_arg="):
        Bucketed(MaskedAttention(), dim=1, buckets=(8,))(torch.randn(2, 5, 8))

    def rows_and_total(x):  # the total's shape happens to equal the bucket: only the padding check catches it
        return x * 2, x.sum(0)

    with pytest.raises(UsageError, match=r"output\[1\] changes with the padding values"):
        Bucketed(rows_and_total, buckets=(8,))(torch.randn(5, 8))


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ((), r"buckets \(\) must be a non-empty sequence"),
        ((1, 4, 2), r"buckets \(1, 4, 2\) are not sorted; write \(1, 2, 4\)"),
        ((0, 2, 4), r"hold 0; every bucket is a positive int"),
        ((-2, 4), r"hold -2; every bucket is a positive int"),
        ((1, 2, 2, 4), r"repeat 2; list each size once"),
        ((1, 2.5), r"hold 2.5; every bucket is a positive int"),
    ],
)
def test_bad_buckets(buckets, message):
    with pytest.raises(UsageError, match=message):
        check_buckets(buckets)
    with pytest.raises(UsageError, match=message):
        Bucketed(mlp(), buckets=buckets)


def test_bucketed_bad_arguments():
    with pytest.raises(UsageError, match=r"size 40 along dim 0 is above the largest bucket 32; add a bucket >= 40"):
        Bucketed(mlp())(torch.randn(40, 8))
    with pytest.raises(UsageError, match=r"dim -1 must be an int >= 0"):
        Bucketed(mlp(), dim=-1)
    with pytest.raises(UsageError, match=r"'mask' is not an argument of the model; arguments: input"):
        Bucketed(mlp(), mask_arg="mask")
    with pytest.raises(UsageError, match=r"'x' is not an argument of the model; arguments: input"):
        Bucketed(mlp(), batch_args=["x[0]"])
    with pytest.raises(UsageError, match=r"no batch-carrying tensor input has dim 2"):
        Bucketed(mlp(), dim=2)(torch.randn(3, 8))
    with pytest.raises(UsageError, match=r"from_range: min 4 > max 2"):
        Bucketed.from_range(mlp(), 0, (4, 2))


# declare_dynamic -----------------------------------------------------------------------------------------------


def test_declared_range_compiles_one_graph(graphs):
    model = mlp()
    compiled = torch.compile(model, backend=graphs)
    for n in (5, 17, 32, 2, 9):
        x = torch.randn(n, 8)
        assert declare_dynamic(compiled, (x,), {}, {"input": {0: (2, 32)}}) == []
        torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs.seen) == 1


def test_declared_range_from_one_compiles_size_one_apart(graphs):
    """Dynamo specializes size 1: a range (1, 32) costs 2 graphs, the symbolic one and size 1, as documented."""
    model = mlp()
    compiled = torch.compile(model, backend=graphs)
    for n in (7, 1, 13, 1, 32, 2):
        x = torch.randn(n, 8)
        notes = declare_dynamic(compiled, (x,), {}, {"input": {0: (1, 32)}})
        assert notes == [
            "input dim 0: range (1, 32) includes size 1, which Dynamo specializes: "
            "one graph each, beside the one for sizes 2..32"
        ]
        torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs.seen) == 2
    assert [(1, 8) in shapes for shapes in graphs.seen] == [False, True]  # the second one is specialized to size 1


def test_declared_paths_inside_lists_dicts_and_kwargs(graphs):
    def fn(images, batch, **extra):
        return images[1].sum(1) + batch["pixels"].mean(1) + extra["bias"]

    compiled = torch.compile(fn, backend=graphs)
    spec = {"images[1]": {0: (2, 16)}, 'batch["pixels"]': {0: (2, 16)}, "bias": {-1: (2, 16)}}
    for n in (3, 6, 16):
        images = [torch.randn(2, 3), torch.randn(n, 4)]
        batch = {"pixels": torch.randn(n, 5)}
        bias = torch.randn(n)
        declare_dynamic(compiled, (images,), {"batch": batch, "bias": bias}, spec)
        torch.testing.assert_close(compiled(images, batch=batch, bias=bias), fn(images, batch, bias=bias))
    assert len(graphs.seen) == 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"y": {0: (1, 4)}}, r"dynamic spec names 'y', which is not an input; inputs: images, batch"),
        ({"images[5]": {0: (1, 4)}}, r"path 'images\[5\]' does not lead to a tensor; tensors there: images\[0\]"),
        ({"batch['n']": {0: (1, 4)}}, r"path \"batch\['n'\]\" does not lead to a tensor; tensors there: batch\['x'\]"),
        ({"images[0]": {2: (1, 4)}}, r"images\[0\] has 2 dims, so dim 2 is out of range; use 0..1 or -2..-1"),
        ({"images[0]": {0: (8, 4)}}, r"images\[0\] dim 0: min 8 > max 4; swap them: \(4, 8\)"),
        ({"images[0]": {0: (-1, 4)}}, r"images\[0\] dim 0: min -1 < 0; sizes start at 0"),
        ({"images[0]": {0: (4, 8)}}, r"images\[0\] dim 0 has size 3, outside its declared range \(4, 8\)"),
        ({"images[0]": {0: 8}}, r"images\[0\] dim 0: range 8 must be two ints \(min, max\)"),
        ({"images[0]": {"0": (1, 4)}}, r"dim '0' must be an int"),
        ({"images[0]": {}}, r"give \{dim: \(min, max\)\}"),
        ([("x", 0)], r"a dynamic spec is a dict"),
    ],
)
def test_declare_dynamic_bad_specs(spec, message):
    def fn(images, batch):
        return images[0]

    x = torch.randn(3, 4)
    with pytest.raises(UsageError, match=message):
        declare_dynamic(fn, ([x],), {"batch": {"x": torch.randn(3), "n": 3}}, spec)
    assert not getattr(x, "_dynamo_dynamic_indices", None)  # validation runs before anything is marked


@pytest.mark.parametrize(
    ("size_range", "note"),
    [
        ((0, 4), "includes sizes 0 and 1, which Dynamo specializes: one graph each, beside the one for sizes 2..4"),
        ((1, 2), "includes size 1, which Dynamo specializes: one graph each, beside the one for size 2"),
        ((1, 1), "includes size 1, which Dynamo specializes: one graph each"),
        ((2, 4), None),
    ],
)
def test_declare_dynamic_notes_and_what_it_marks(size_range, note):
    x = torch.randn(min(size_range[1], 2), 3)
    notes = declare_dynamic(lambda x: x, (x,), None, {"x": {0: size_range}})
    assert notes == ([f"x dim 0: range {size_range} {note}"] if note else [])
    marked = bool(getattr(x, "_dynamo_dynamic_indices", None))
    assert marked == (size_range[1] > 2)  # sizes 0 and 1 and a single size 2 stay static
