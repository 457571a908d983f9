import dataclasses
import json

import pytest
import torch

from fullgraph.bench.results import read_csv
from fullgraph.bench.suites import zoo as suite
from fullgraph.bench.suites.zoo_models import SMALL
from fullgraph.cli.main import main
from fullgraph.errors import UsageError
from tests.bench.suites import run_suite

MISSING = "fullgraph_zoo_missing_package"  # a package no machine has


@pytest.mark.slow
def test_small_runs_end_to_end_with_every_variant_its_errors_and_the_rewrites(tmp_path, capsys, monkeypatch):
    # the stand-ins, and one that needs a package nobody has: skipped with one line, the others run
    needs = dataclasses.replace(SMALL[0], name="small/needs_missing", library=MISSING)
    monkeypatch.setattr(suite, "SMALL", (*SMALL, needs))
    # auto takes no rewrite on the CPU (never measured there): forced, as `rewrites=[...]` does
    rows, timed = run_suite(tmp_path, "zoo", "--small", "--batches", "2", "--rewrites", "patch_gemm,gelu_epilogue")
    assert timed == {"eager", "plain", "plain again", "fullgraph"}
    cases = {r.case for r in rows}
    assert cases == {"small/patch_mlp b2 default", "small/tiny_encoder b2 default", "summary"}
    value = {(r.case, r.variant, r.metric): r.value for r in rows}
    for case in cases - {"summary"}:
        assert value[(case, "eager", "rel_err")] == 0  # fp32 eager is the reference itself
        for v in suite.COMPILED:  # fp32 on the CPU: compiled, rewritten or not, matches eager fp32
            assert value[(case, v, "rel_err")] < 1e-5, (case, v)
            assert value[(case, v, "round_min_ms")] <= value[(case, v, "median_ms")] <= value[(case, v, "round_max_ms")]
        assert value[(case, "plain", "over_plain")] == 1
        speedup, again = (value[(case, v, "over_plain")] for v in ("fullgraph", "plain again"))
        assert value[(case, "fullgraph", "loss")] == float(suite.is_loss(speedup, again))
        # what each compiled variant's first call compiled, from Dynamo's counters: one graph and no break for
        # plain and fullgraph (the rewrites change a graph's code, not how many there are); plain again, another
        # instance of plain's class under the same backend, runs plain's compiled code; nothing compiled while timed
        graphs = {v: (value[(case, v, "graphs")], value[(case, v, "graph_breaks")]) for v in suite.COMPILED}
        assert graphs == {"plain": (1, 0), "plain again": (0, 0), "fullgraph": (1, 0)}, case
        assert value[(case, "fullgraph", "compiled_while_timed")] == 0 and value[(case, "fullgraph", "fell_back")] == 0
    # the patch embedding as a GEMM, fc1 + the exact GELU as one addmm (erf on the CPU: the model's own GELU)
    assert value[("small/patch_mlp b2 default", "fullgraph", "rewrite_patch_gemm")] == 1
    assert value[("small/patch_mlp b2 default", "fullgraph", "rewrite_gelu_epilogue")] == 1
    assert value[("small/tiny_encoder b2 default", "fullgraph", "rewrites_applied")] == 1  # no convolution there
    params = {r.case: json.loads(r.params) for r in rows if r.variant == "fullgraph"}
    assert params["small/patch_mlp b2 default"]["rewrites"] == "patch_gemm=1,gelu_epilogue=1"
    assert params["small/patch_mlp b2 default"]["dtype"] == "fp32"
    assert params["summary"]["rewrites_asked"] == "patch_gemm,gelu_epilogue"
    assert value[("summary", "fullgraph", "points")] == 2 and value[("summary", "fullgraph", "rewritten_points")] == 2
    captured = capsys.readouterr()
    assert f"skipped small/needs_missing: {MISSING} is not installed" in captured.out
    assert "Traceback" not in captured.out + captured.err
    assert "median fullgraph / plain:" in captured.out and "over the 2 points where a rewrite applied" in captured.out
    assert "] zoo 1/2 small/patch_mlp b2 default: compiling fullgraph\n" in captured.err
    # the table and summary again from the CSV alone (a run's parts, one per device call, read together)
    table = [line for line in captured.out.splitlines() if line.startswith(("small/", "median", "losses"))]
    assert main(["bench", "zoo", "--from-csv", str(tmp_path / "zoo.csv"), "--csv", str(tmp_path / "sum.csv")]) == 0
    again = capsys.readouterr().out.splitlines()
    assert [line for line in again if line.startswith(("small/", "median", "losses"))] == table
    assert {r.metric: r.value for r in read_csv(tmp_path / "sum.csv")}["points"] == 2


def test_from_csv_needs_its_files(tmp_path, capsys):
    assert main(["bench", "zoo", "--from-csv", str(tmp_path / "none.csv"), "--csv", str(tmp_path / "o.csv")]) != 0
    assert "--from-csv: no file" in capsys.readouterr().err


def test_a_missing_library_skips_its_models_with_one_line_and_no_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # as if not installed
    rows, timed = run_suite(tmp_path, "zoo", "--models", "transformers")
    assert rows == [] and timed == set()
    out = capsys.readouterr()
    skipped = [line for line in out.out.splitlines() if line.startswith("skipped ")]
    assert skipped == ["skipped transformers/BertModel, transformers/GPT2Model, transformers/ViTModel, "
                       "transformers/CLIPVisionModel: transformers is not installed"]  # fmt: skip
    assert "Traceback" not in out.out + out.err and "points: 0 measured" in out.out


def point(plain: float, again: float, ours: float, rewrites=None) -> suite.Point:
    p = suite.Point("m", 4, "default", rewrites=rewrites or {})
    p.ms = {"eager": 2.0, "plain": plain, "plain again": again, "fullgraph": ours}
    p.errors = dict.fromkeys(suite.VARIANTS, 0.01)
    return p


@pytest.mark.parametrize(
    ("speedup", "again", "loss"),
    [
        (0.98, 1.0, True),  # below 0.99 and below what plain measures against itself
        (0.90, 0.95, True),
        (0.98, 0.97, False),  # within this point's noise: a second plain instance measured slower still
        (0.985, 0.985, False),  # equal to the noise floor is not below it
        (0.995, 1.05, False),  # never a loss from 0.99 up
        (1.10, 1.00, False),
    ],
)
def test_the_noise_rule(speedup, again, loss):
    assert suite.is_loss(speedup, again) is loss


def test_a_slowed_fullgraph_is_flagged_in_the_table_and_the_summary():
    slowed = point(plain=1.0, again=1.0, ours=1.05, rewrites={"patch_gemm": 1})  # 0.952x with no noise
    noisy = point(plain=1.0, again=1.04, ours=1.03)  # 0.971x where plain again measured 0.962x: noise
    fast = point(plain=1.0, again=0.99, ours=0.8, rewrites={"gelu_epilogue": 12})
    assert slowed.loss and not noisy.loss and not fast.loss
    assert suite._table_row(slowed)[-2:] == ["patch_gemm=1", "LOSS"]
    assert suite._table_row(noisy)[-2:] == ["none", ""]
    lines = suite.summary_lines([slowed, noisy, fast], failed=["m b64 default: OutOfMemoryError: ..."])
    assert lines[0] == "points: 3 measured, 1 failed"
    assert lines[1].endswith("ratio): 1: m b4 default")
    # speed-ups 0.952, 0.971 and 1.25; the rewritten ones 0.952 and 1.25, median 1.101
    assert (
        lines[2] == "median fullgraph / plain: 0.971x over all points; 1.101x over the 2 points where a rewrite applied"
    )
    assert lines[3] == "  failed: m b64 default: OutOfMemoryError: ..."
    split = point(plain=1.0, again=1.0, ours=2.0)  # what ResNet-50 at b4 looked like; these say why, where it is so
    split.graphs = {"plain": (1, 0), "plain again": (1, 0), "fullgraph": (3, 2)}
    split.compiled_while_timed = 4
    assert suite.summary_lines([split, fast], failed=[])[3:] == [
        "  note: m b4 default: fullgraph compiled 3 graph(s) with 2 break(s), plain 1 with 0",
        "  note: m b4 default: 4 graph(s) compiled during the timed rounds",
    ]


def test_the_verdict_pairs_plain_and_fullgraph_round_by_round_and_the_csv_keeps_the_rounds():
    # fullgraph as fast as plain in every round, but a slow spell caught plain in round 4 and not fullgraph: the
    # medians (2.0 against 1.0) would read 2x; round by round 1, 1, 1, 1, 2 (median 1)
    p = point(plain=2.0, again=2.0, ours=1.0)
    p.rounds = {"plain": [2.0, 1.0, 1.0, 2.0, 2.0], "plain again": [2.0, 1.0, 1.0, 2.0, 2.0],
                "fullgraph": [2.0, 1.0, 1.0, 2.0, 1.0], "eager": [3.0] * 5}  # fmt: skip
    assert p.speedup == pytest.approx(1.0) and p.again == pytest.approx(1.0)
    slower = point(plain=1.0, again=1.0, ours=1.0)
    slower.rounds = {"plain": [1.0, 2.0, 1.0], "plain again": [1.0, 2.0, 1.0], "fullgraph": [1.05, 2.1, 1.05],
                     "eager": [3.0] * 3}  # fmt: skip
    assert slower.speedup == pytest.approx(1 / 1.05) and slower.loss  # equal medians, but 5% slower in every round
    slower.ranges = {v: (min(r), max(r)) for v, r in slower.rounds.items()}
    rows = suite._rows(slower, {"dtype": "bf16"})
    assert {r.metric for r in rows if r.variant == "fullgraph" and r.metric.startswith("round_ms_")} == {
        "round_ms_00", "round_ms_01", "round_ms_02"}  # fmt: skip
    (back,) = suite.points_from_rows(rows)
    assert back.rounds["fullgraph"] == slower.rounds["fullgraph"] and back.loss


def test_select_takes_model_and_library_names_in_the_catalogs_order():
    names = [e.name for e in suite.select("torchvision/resnet50,timm", small=False)]
    timm = ("vit_small_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224", "convnext_tiny",
            "swin_tiny_patch4_window7_224", "resnet50", "efficientnet_b0")  # fmt: skip
    assert names[:7] == [f"timm/{n}" for n in timm]
    assert names[7:] == ["torchvision/resnet50"]
    assert [e.library for e in suite.select(None, small=False)].count("transformers") >= 3
    assert [e.name for e in suite.select(None, small=True)] == ["small/patch_mlp", "small/tiny_encoder"]
    with pytest.raises(UsageError, match="--models: unknown resnet"):
        suite.select("resnet", small=False)
    with pytest.raises(UsageError, match="--models: unknown ','"):
        suite.select(",", small=False)


def test_batches_for_every_model_or_per_model_or_library():
    entries = suite.select("timm/resnet50,transformers/BertModel,torchvision", small=False)
    own = suite.parse_batches(None, entries)
    assert own["timm/resnet50"] == (4, 128) and own["transformers/BertModel"] == (4, 64)
    assert set(suite.parse_batches("2,8", entries).values()) == {(2, 8)}
    per = suite.parse_batches("timm/resnet50=1,32; torchvision=2", entries)
    assert per["timm/resnet50"] == (1, 32) and per["torchvision/vit_b_16"] == (2,)
    assert per["transformers/BertModel"] == (4, 64)
    with pytest.raises(UsageError, match="'timm/vit_base_patch16_224' is none of the models run"):
        suite.parse_batches("timm/vit_base_patch16_224=4", entries)
    with pytest.raises(UsageError, match="--batches: cannot read 'x'"):
        suite.parse_batches("timm/resnet50=x", entries)


def test_rewrites_spec():
    assert suite.parse_rewrites(None) == "auto" and suite.parse_rewrites("none") == ()
    assert suite.parse_rewrites("patch_gemm, gelu_epilogue") == ("patch_gemm", "gelu_epilogue")
    with pytest.raises(UsageError, match="unknown rewrite 'patch'"):
        suite.parse_rewrites("patch")


class Fails(torch.nn.Module):
    def forward(self, x):
        raise ValueError("no such shape")


def test_failures_are_reported_in_place_and_exit_1(tmp_path, capsys, monkeypatch):
    def broken(_):
        raise AttributeError("module 'timm' has no attribute 'create_model'")

    unbuilt = dataclasses.replace(SMALL[0], name="small/unbuilt", build=broken)
    monkeypatch.setattr(
        suite, "SMALL", (unbuilt, dataclasses.replace(SMALL[0], name="small/fails", build=lambda _: Fails()))
    )
    path = tmp_path / "zoo.csv"
    assert main(["bench", "zoo", "--small", "--device", "cpu", "--batches", "2", "--csv", str(path)]) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "  failed: small/unbuilt: build: AttributeError: module 'timm' has no attribute 'create_model'" in lines
    assert "  failed: small/fails b2 default: reference: ValueError: no such shape" in lines
    assert "points: 0 measured, 2 failed" in lines and "Traceback" not in out.out + out.err
    assert "fullgraph bench zoo: failed: 2 point(s) failed: small/unbuilt: build: AttributeError" in out.err


def test_prewarm_runs_each_model_once_as_the_timed_run_will_before_timing(tmp_path, monkeypatch):
    warmed, timed = [], []
    monkeypatch.setattr(suite, "run_children", lambda children, jobs: warmed.append((list(children), jobs)))
    monkeypatch.setattr(suite, "_model_points", lambda entry, *a: timed.append(len(warmed)) or iter(()))
    argv = ["bench", "zoo", "--small", "--prewarm", "3", "--batches", "2", "--rewrites", "patch_gemm",
            "--approximate-gelu", "--device", "cpu", "--csv", str(tmp_path / "z.csv")]  # fmt: skip
    main(argv)
    ((children, jobs),) = warmed
    assert jobs == 3 and [name for name, _ in children] == [e.name for e in SMALL]
    assert timed == [1] * len(SMALL)  # every model warmed before the first is timed
    name, cmd = children[0]
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=False))
    assert cmd[1:5] == ["-m", "fullgraph", "bench", "zoo"] and flags["--models"] == name
    assert flags["--reps"] == "1" and flags["--csv"] == suite.os.devnull and flags["--batches"] == "2"
    assert flags["--rewrites"] == "patch_gemm" and flags["--device"] == "cpu"
    assert cmd[-2:] == ["--approximate-gelu", "--small"]
