"""The checklist judges only from rows that ran (issue 34, item 2): each sentence names the rows it rests on."""

from fullgraph.diagnose import configs as cfg
from fullgraph.diagnose.checklist import build_checklist
from fullgraph.diagnose.report import ConfigResult, Report
from tests.diagnose.test_configs import row

SKIPPED = ConfigResult("compile max-autotune fp32", "max-autotune", "fp32", error="skipped: the --budget ran out")


def _checklist(configs):
    report = Report("t", "cpu", [], {}, configs=configs, recommendation=cfg.recommend(configs))
    return {c.item: c for c in build_checklist(report, vary=(), gpu=False)}


def test_mode_choice_names_the_rows_timed_and_never_a_row_that_did_not_run():
    items = _checklist([row("eager fp32", 10.0, mode="eager"), row("compile default fp32", 5.0), SKIPPED])
    chosen = items["Compile mode chosen by measurement"]
    assert chosen.status == "pass" and chosen.evidence.startswith("timed eager fp32, compile default fp32; ")
    assert "max-autotune" not in chosen.evidence
    numerics = items["Numerics checked against eager float32"].evidence
    assert numerics == "2 of 3 configuration(s) within tolerance: eager fp32, compile default fp32"


def test_with_only_eager_timed_nothing_is_judged_about_compiling():
    items = _checklist([row("eager fp32", 10.0, mode="eager"), SKIPPED])
    assert items["Compile mode chosen by measurement"].status == "not-measured"
    assert items["Compile time weighed against the speed-up"].status == "not-measured"
