import pytest

from fullgraph.bench.suites import dit as suite
from fullgraph.errors import UsageError
from tests.bench.suites import run_suite


@pytest.mark.slow
def test_suite_times_ours_and_the_plain_twin_compiled_and_eager(tmp_path, capsys):
    rows, timed = run_suite(tmp_path, "dit", "--tokens", "33", "--depth", "1")  # one block: every variant compiles
    assert {"plain, compiled", "ours auto, compiled", "ours native, compiled", "plain, eager"} <= timed
    errors = {r.variant: r.value for r in rows if r.metric == "rel_err"}
    assert errors["plain, eager"] == 0 and all(e < 1e-5 for e in errors.values()), errors  # fp32 against fp32
    ratio = {r.variant: r.value for r in rows if r.metric == "over_plain_compiled"}
    assert ratio["plain, compiled"] == 1 and all(v > 0 for v in ratio.values())
    out = capsys.readouterr().out
    if "ours kernel, compiled" not in timed:  # no kernel runs on this CPU: skipped, with our reason, not Dynamo's
        assert "skipped: FullgraphError: layer_norm: policy 'kernel'" in out
        assert "skipped: FullgraphError: qk_norm_rope: policy 'kernel'" in out
    else:  # the fused kernels inside the compiled stack and without them: the twin's output either way (above)
        assert {"ours kernel, compiled", "ours auto, fused norms native, compiled"} <= timed


@pytest.mark.parametrize("spec", ["a", "0", ","])
def test_bad_tokens(spec):
    with pytest.raises(UsageError, match="--tokens"):
        suite.parse_tokens(spec, gpu=False)


def test_extra_policies_are_checked_and_labelled_by_their_spec():
    assert suite.extra_policies("all=auto,+qk_norm_rope; none,+layer_norm_modulate") == {
        "all=auto,+qk_norm_rope": "all=auto,+qk_norm_rope",
        "none,+layer_norm_modulate": "none,+layer_norm_modulate",
    }
    assert suite.extra_policies(None) == {}
    with pytest.raises(UsageError, match="unknown op"):
        suite.extra_policies("+qk_rope")
    with pytest.raises(UsageError, match="cannot read"):
        suite.extra_policies("fast")


def test_video_rope_builds_the_grid_and_takes_one_token_count():
    import argparse

    import torch

    args = argparse.Namespace(config=None, depth=1, rope="video", device="cpu", tokens="64,2048", dtype=None)
    with pytest.raises(UsageError, match="--rope video takes one --tokens count, a multiple of 1024"):
        suite.run(args)
    cfg, ours, plain = suite.build(args, gpu=False, max_tokens=2048)
    assert (cfg.rope, cfg.grid) == ("video", (2, 32, 32))
    _, _, flat_plain = suite.build(argparse.Namespace(config=None, depth=1, rope="1d"), gpu=False, max_tokens=2048)
    flat_plain.load_state_dict(plain.state_dict())
    x, c = torch.randn(1, 2048, cfg.dim), torch.randn(1, cfg.dim)
    with torch.no_grad(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        video, ours_video, line = plain(x, c), ours(x, c), flat_plain(x, c)
    torch.testing.assert_close(ours_video, video, rtol=1e-4, atol=1e-5)  # the twins agree on the grid's positions
    assert video.shape == line.shape
    assert not torch.equal(plain.rope_cos, flat_plain.rope_cos)  # and those positions are not the 1-D ones
