"""benchmarks/doctor_models.py without a GPU: the set issue 34 asks for, the parts it is split into (one device call
each), and the parts' CSVs read back into one table with the failed checks in bold."""

import itertools
import sys

import pytest
import torch

from tests.bench.scripts import load_script


@pytest.fixture(scope="module")
def dm():
    path = list(sys.path)
    yield load_script("doctor_models")  # puts the repository and benchmarks/ on sys.path, for doctor_cases
    sys.path[:] = path
    sys.modules.pop("doctor_cases", None)


def test_the_acceptance_set_is_fifteen_third_party_models_of_every_kind(dm):
    cases = dm.select([], small=False)
    assert len(cases) >= 15 and all(c.group in dm.ACCEPTANCE for c in cases)
    detectors = [c for c in cases if c.detector]
    assert len(detectors) >= 3 and all(c.with_[0] == "nms" and torch.bfloat16 in c.dtypes for c in detectors)
    assert {c.name for c in detectors if "roi_align" in c.with_} == {"fasterrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn"}
    names = {c.name for c in cases}
    assert {"gpt2_greedy", "t5_small", "bert_base"} <= names  # a KV cache, an encoder-decoder, keyword inputs
    assert {c.group for c in cases} == set(dm.ACCEPTANCE)
    # the order named (a group's in the catalog's order), each case once
    assert [c.name for c in dm.select(["detectors", "t5_small"], small=False)] == [c.name for c in detectors] + [
        "t5_small"
    ]
    picked = [c.name for c in dm.select(["maskrcnn_resnet50_fpn", "t5_small", "detectors"], small=False)]
    assert picked == ["maskrcnn_resnet50_fpn", "t5_small"] + [c.name for c in detectors if c.name != picked[0]]
    with pytest.raises(SystemExit, match="unknown model or group nope"):
        dm.select(["nope"], small=False)


def test_parts_fit_one_device_call_each_and_cover_the_set_in_order(dm):
    cases = dm.select([], small=False)
    parts = dm.parts(cases, dm.PART_S)
    assert [c for p in parts for c in p] == cases
    assert all(sum(c.est_s for c in p) <= dm.PART_S for p in parts)
    assert all(sum(c.est_s for c in p) + q[0].est_s > dm.PART_S for p, q in itertools.pairwise(parts))
    plan = dm.plan(cases, dm.PART_S)
    assert plan.count("bash benchmarks/h200.sh doctor-models") == len(parts)


def test_the_parts_csvs_read_back_as_one_table_with_failures_in_bold(dm, tmp_path, capsys):
    ok = {"model": "resnet50", "group": "timm", "explain_breaks": 0, "skipped_frames": 0, "doctor_s": 40, "wall_s": 45,
          **dict.fromkeys(dm.CHECKS, "0"), "failed_checks": ""}  # fmt: skip
    bad = {**ok, "model": "retinanet_resnet50_fpn", "group": "detectors", "explain_breaks": 8, "terminal": "2 (ref 8)",
           "failed_checks": "terminal"}  # fmt: skip
    err = {"model": "tv_vit_b_16", "group": "torchvision", "error": "RuntimeError: out of memory", "wall_s": 3}
    dm.write([ok, bad], {}, str(tmp_path / "a.csv"))
    dm.write([err], {}, str(tmp_path / "b.csv"))
    assert dm.main(["--from-csv", f"{tmp_path / 'a.csv'},{tmp_path / 'b.csv'}"]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(rows) == 4 and rows[0].count("|") == len(dm.HEADS) + 4
    assert "| **2 (ref 8)** |" in rows[2] and "**" not in rows[1] and "**error: RuntimeError" in rows[3]
    assert "every check holds on 1; not on: retinanet_resnet50_fpn (terminal), tv_vit_b_16 (error)" in out
    with pytest.raises(SystemExit, match="no file"):
        dm.main(["--from-csv", str(tmp_path / "missing.csv")])


def test_the_set_must_show_a_failed_row_running_with_our_fixes_somewhere(dm):
    """A model whose rows all ran as written has nothing for the fixes to show, and passes; the set as a whole must
    show one row that failed as written running with them (the acceptance's bf16 row)."""
    ran = {
        "model": "retinanet",
        "group": "detectors",
        "explain_with": "fp32=5",
        "with_fix_rows": "no row failed as written",
    }
    rescued = {
        **ran,
        "model": "ssdlite",
        "with_fix_rows": "eager bf16: failed -> 360 ms, 92.3% matched, over tolerance",
    }
    still = {
        **ran,
        "model": "fasterrcnn",
        "with_fix_rows": "eager bf16: failed -> failed",
        "failed_checks": "with_fix_rows",
    }
    assert dm.holds([ran, rescued]) and "no model shows" not in dm.verdict([ran, rescued])
    assert not dm.holds([ran]) and dm.verdict([ran]).endswith(
        "no model shows a row that failed as written running with our fixes"
    )
    assert not dm.holds([ran, rescued, still]) and "not on: fasterrcnn (with_fix_rows)" in dm.verdict(
        [ran, rescued, still]
    )
    plain = {"model": "resnet50", "group": "timm", "explain_with": ""}
    assert dm.holds([plain])  # no fixes measured: nothing to show
