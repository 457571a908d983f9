import pytest

from fullgraph.bench.suites import vit as suite
from fullgraph.cli.main import main
from fullgraph.errors import UsageError
from tests.bench.suites import run_suite


@pytest.mark.slow
def test_suite_times_the_reference_and_ours_eager_and_compiled(tmp_path, capsys):
    rows, timed = run_suite(tmp_path, "vit", "--batches", "3")
    preset = "ours, fullgraph.compile dev fp32"  # the CPU's default preset row
    assert timed == {"plain, eager fp32", "plain, compiled default fp32", "ours, compiled default fp32", preset}
    errors = {r.variant: r.value for r in rows if r.metric == "rel_err"}
    assert errors["plain, eager fp32"] == 0 and errors["plain, compiled default fp32"] < 1e-5, errors
    # ours runs the tanh GELU against the reference's exact one: close, and not identical (a wrong model is far off)
    assert 1e-7 < errors["ours, compiled default fp32"] < 1e-2, errors
    assert 1e-7 < errors[preset] < 1e-2, errors
    first = {r.variant: r.value for r in rows if r.metric == "first_call_s"}
    assert first["plain, compiled default fp32"] > first["plain, eager fp32"]  # the compile is in the first call
    # the preset's copy of ours compiles on its own (Dynamo would otherwise serve it ours' default-mode entry)
    assert first[preset] > first["plain, eager fp32"], first
    throughput = {r.variant: r.value for r in rows if r.metric == "images_per_s"}
    median = {r.variant: r.value for r in rows if r.metric == "median_ms"}
    assert all(abs(throughput[v] * median[v] - 3e3) < 1e-6 * 3e3 for v in timed)
    speedup = {r.variant: r.value for r in rows if r.metric == "speedup_vs_eager_fp32"}
    assert all(abs(speedup[v] * median[v] - median["plain, eager fp32"]) < 1e-9 for v in timed), speedup
    captured = capsys.readouterr()
    assert "reference: plain" in captured.out and "x eager fp32" in captured.out
    assert f"] vit b3: compiling {preset}\n" in captured.err and "] vit b3: timing plain, eager fp32\n" in captured.err


@pytest.mark.slow
def test_presets_none_drops_the_preset_rows(tmp_path):
    _, timed = run_suite(tmp_path, "vit", "--batches", "2", "--presets", "none")
    assert timed == {"plain, eager fp32", "plain, compiled default fp32", "ours, compiled default fp32"}


@pytest.mark.parametrize(
    ("spec", "gpu", "match"),
    [("fast", True, "--presets: unknown fast"), ("dev,none", False, "unknown none"), (",", True, "empty list"),
     ("perception", False, "--presets: perception replays CUDA graphs and needs a GPU")],
)  # fmt: skip
def test_bad_presets(spec, gpu, match):
    with pytest.raises(UsageError, match=match):
        suite.parse_presets(spec, gpu)


def test_a_bad_preset_fails_the_command_before_anything_runs(tmp_path, capsys):
    csv = tmp_path / "vit.csv"
    assert main(["bench", "vit", "--device", "cpu", "--presets", "fastest", "--csv", str(csv)]) == 2
    assert "--presets: unknown fastest" in capsys.readouterr().err and not csv.exists()


def test_presets():
    assert suite.parse_presets(None, gpu=True) == ("perception", "dev")
    assert suite.parse_presets(None, gpu=False) == ("dev",)
    assert suite.parse_presets("none", gpu=True) == ()
    assert suite.parse_presets(" edge, dev,edge ", gpu=False) == ("edge", "dev")


@pytest.mark.parametrize(("spec", "gpu", "match"), [("fast", True, "unknown fast"), ("reduce-overhead", False, "GPU")])
def test_bad_modes(spec, gpu, match):
    with pytest.raises(UsageError, match=match):
        suite.parse_modes(spec, gpu)


def test_default_modes():
    assert suite.parse_modes(None, gpu=True) == ("default", "reduce-overhead")
    assert suite.parse_modes(None, gpu=False) == ("default",)


@pytest.mark.slow
def test_policies_add_the_first_preset_under_each_op_policy(tmp_path):
    rows, timed = run_suite(tmp_path, "vit", "--batches", "2", "--modes", "default", "--policies", "all=native")
    extra = "ours, fullgraph.compile dev fp32 all=native"
    assert extra in timed
    errors = {r.variant: r.value for r in rows if r.metric == "rel_err"}
    # on the CPU compiled `auto` is every op's native form: the same numbers as the preset's own row
    assert errors[extra] == pytest.approx(errors["ours, fullgraph.compile dev fp32"], rel=1e-6)


def test_a_policied_variant_calls_inside_its_policy():
    from fullgraph.ops import policies

    seen = []
    call = suite.Policied(lambda x: seen.append(policies.effective("layer_norm")) or x, "all=native,+layer_norm")
    assert call(3) == 3 and seen == ["kernel"]
    assert policies.effective("layer_norm") == "auto"  # put back after the call


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--policies", "+layer_nrom"], "layer_nrom"), (["--policies", "all=native", "--presets", "none"], "a preset")],
)
def test_bad_policies_fail_the_command_before_anything_runs(tmp_path, capsys, argv, message):
    csv = tmp_path / "vit.csv"
    assert main(["bench", "vit", "--device", "cpu", *argv, "--csv", str(csv)]) == 2
    assert message in capsys.readouterr().err and not csv.exists()
