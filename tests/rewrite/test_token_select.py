"""token_select (issue 33): a model that reads one token at the end computes it alone through the row-wise layers
before it. Small models written as users write them (timm's ViT layout: class token, SDPA attention, LayerNorm, MLP),
on the CPU, against a float64 eager reference."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fullgraph
from tests.rewrite.test_rewrites import reference


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim)
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    """timm's layout: patches, a class token, position embeddings, blocks, a final norm, the head on x[:, 0]."""

    def __init__(self, dim=32, heads=2, depth=2, patch=8, image=32, read="x[:, 0]", also_tokens=False):
        super().__init__()
        n = (image // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.5)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 10)
        self.read, self.also_tokens = read, also_tokens

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        token = {"x[:, 0]": lambda: x[:, 0], "x[:, 0, :]": lambda: x[:, 0, :], "select(1, -1)": lambda: x.select(1, -1),
                 "mean": lambda: x.mean(1)}[self.read]()  # fmt: skip
        return (self.head(token), x) if self.also_tokens else self.head(token)


def run(model, x, **kwargs):
    torch._dynamo.reset()
    cm = fullgraph.compile(copy.deepcopy(model), "dev", **kwargs)
    with torch.no_grad():
        return cm(x), cm


def close(out, ref, tol=1e-5):
    return (out.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.parametrize("read", ["x[:, 0]", "x[:, 0, :]", "select(1, -1)"])
def test_the_read_token_is_computed_alone_and_matches_fp64(read):
    torch.manual_seed(0)
    model, x = TinyViT(read=read).eval(), torch.randn(3, 3, 32, 32)
    out, cm = run(model, x)  # auto: taken on the CPU too
    (applied,) = cm.stats.rewrites
    assert applied.rewrite == "token_select"
    # the last block's projection, fc1 and fc2, both residual adds, norm2, GELU, dropout, and the final norm
    assert (
        applied.detail
        == f"token {-1 if 'select' in read else 0} of 17 computed alone through 9 row-wise nodes (3 linear)"
    )
    assert cm.stats.graph_breaks == 0
    assert close(out, reference(model, x))


def test_a_model_that_also_returns_every_token_is_left_as_it_is():
    torch.manual_seed(1)
    model, x = TinyViT(also_tokens=True).eval(), torch.randn(2, 3, 32, 32)
    (logits, tokens), cm = run(model, x, rewrites=["token_select"])
    assert cm.stats.rewrites == ()
    ref_logits, ref_tokens = reference(model, x)
    assert close(logits, ref_logits) and close(tokens, ref_tokens)


def test_a_mean_pool_reads_every_token_and_is_left_as_it_is():
    torch.manual_seed(2)
    model, x = TinyViT(read="mean").eval(), torch.randn(2, 3, 32, 32)
    out, cm = run(model, x, rewrites=["token_select"])
    assert cm.stats.rewrites == ()
    assert close(out, reference(model, x))


class SideOutput(nn.Module):
    """The MLP's hidden state is also returned: it stays whole, and the selection stops there."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(16, 32), nn.Linear(32, 16), nn.LayerNorm(16)
        self.scale = nn.Parameter(torch.randn(16))

    def forward(self, x, shift):
        hidden = F.gelu(self.fc1(x))
        y = self.norm(x + self.fc2(hidden) * self.scale + shift)  # shift: [B, 1, C], broadcast along the tokens
        return y[:, 0], hidden.sum()


def test_a_node_used_elsewhere_stays_whole_and_broadcast_operands_follow():
    torch.manual_seed(3)
    model = SideOutput().eval()
    x, shift = torch.randn(2, 5, 16), torch.randn(2, 1, 16)
    torch._dynamo.reset()
    cm = fullgraph.compile(copy.deepcopy(model), "dev", rewrites=["token_select"])
    with torch.no_grad():
        (y, total) = cm(x, shift)
        ref_y, ref_total = copy.deepcopy(model).double()(x.double(), shift.double())
    (applied,) = cm.stats.rewrites
    assert "(1 linear)" in applied.detail  # fc2 for the one token; fc1 and the GELU stay whole
    assert close(y, ref_y) and close(total, ref_total)


def test_a_dynamic_batch_keeps_the_rewrite_and_compiles_once():
    torch.manual_seed(4)
    model = TinyViT().eval()
    torch._dynamo.reset()
    cm = fullgraph.compile(copy.deepcopy(model), "dev", dynamic={"img": {0: (2, 16)}})  # the batch; tokens static
    with torch.no_grad():
        for batch in (2, 5):
            x = torch.randn(batch, 3, 32, 32)
            assert close(cm(x), reference(model, x))
    assert {a.rewrite for a in cm.stats.rewrites} == {"token_select"}
    assert cm.stats.frames_compiled == 1


@pytest.mark.slow
def test_transformers_classifiers_read_one_token_and_keep_their_values():
    """Code we did not write: transformers' ViT and BERT classifiers, tiny configs, called as their users call them."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(5)
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    vit = tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, num_labels=3, **small)).eval()
    bert = tf.BertForSequenceClassification(tf.BertConfig(vocab_size=100, num_labels=3, **small)).eval()
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, -4:] = 0  # padding, as a batch of two sentences has
    for model, inputs in ((vit, {"pixel_values": torch.randn(2, 3, 32, 32)}),
                          (bert, {"input_ids": torch.randint(0, 100, (2, 12)), "attention_mask": mask})):  # fmt: skip
        torch._dynamo.reset()
        cm = fullgraph.compile(copy.deepcopy(model), "dev")
        with torch.no_grad():
            out = cm(**inputs).logits
            as64 = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
            ref = copy.deepcopy(model).double()(**as64).logits
        assert [a.rewrite for a in cm.stats.rewrites] == ["token_select"], type(model).__name__
        assert "(3 linear)" in cm.stats.rewrites[0].detail  # the last layer's output projection and MLP
        assert cm.stats.graph_breaks == 0
        assert close(out, ref), type(model).__name__


class RmsTail(nn.Module):
    """An RMSNorm head (nn.RMSNorm, and F.rms_norm with the shape as a list): row-wise, so in the region."""

    def __init__(self):
        super().__init__()
        self.mix, self.fc, self.norm = nn.Linear(4, 4), nn.Linear(16, 16), nn.RMSNorm(16)

    def forward(self, x):
        x = self.mix(x.transpose(1, 2)).transpose(1, 2)  # mixes the tokens: where the region must stop
        x = torch.nn.functional.rms_norm(self.fc(x), [16]) + x
        return self.norm(x)[:, 0]


def test_rms_norms_over_the_last_dim_are_row_wise():
    torch.manual_seed(6)
    model, x = RmsTail().eval(), torch.randn(2, 4, 16)
    out, cm = run(model, x, rewrites=["token_select"])
    (applied,) = cm.stats.rewrites
    assert applied.detail == "token 0 of 4 computed alone through 4 row-wise nodes (1 linear)"
    assert close(out, reference(model, x))
