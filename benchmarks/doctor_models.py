"""`fullgraph.doctor` on third-party models, each report checked surface by surface (issue 34, item 8).

The set (`doctor_cases.py`): timm ViT-B/16, ResNet-50, ConvNeXt-T, Swin-T and EfficientNet-B0; transformers BERT-base
(keyword inputs), GPT-2 greedy decoding with a KV cache, T5-small (an encoder-decoder) and CLIP's vision tower;
torchvision ResNet-50, ConvNeXt-T and ViT-B/16; torchvision's Faster R-CNN, Mask R-CNN, RetinaNet and SSDlite on a
list of images, run as written and with our fixes (`with_=("nms",)`; R-CNN's also `"roi_align"`) in fp32 and bf16.
Random weights, built offline.
Group `ours` adds the doctor's own test models; `--small` runs CPU stand-ins (tiny transformers, the test models,
a torchvision NMS stand-in) in a minute or two.

Per model, the doctor runs with `budget=120` (s) and is checked against references measured apart from it
(`tests/diagnose/surfaces.py`): the break count on every surface (terminal, HTML, JSON, advice, checklist) against
`torch._dynamo.explain`'s on a fresh copy; with our fixes, the counts per dtype against explain with the fixes on,
and the rows as written that failed against the same rows with the fixes; no advice naming a row that did not run;
no rate above 105% of its ceiling; a detector's compiled rows judged by matched detections; every row the budget
skipped named. Each check is a column: its value where it holds, the mismatch (in bold) where it does not.

Run (the H200; each device call at most 10 minutes, so the set runs in parts):
  PYTHONPATH=src python3 benchmarks/doctor_models.py --plan            # the parts, one command each
  DOCTOR_MODELS_ARGS="timm clip_vision_b32" bash benchmarks/h200.sh doctor-models
  PYTHONPATH=src python3 benchmarks/doctor_models.py --from-csv a.csv,b.csv   # the parts' CSVs as one table
CPU: PYTHONPATH=src python3 benchmarks/doctor_models.py --small --device cpu
Writes doctor_models.csv and doctor_models.json (every report) under $OUT when it is set, or where --csv says.
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import json
import os
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]  # the cases and checks live with the doctor's CPU tests

from doctor_cases import ACCEPTANCE, Case, moved, select  # noqa: E402
from tests.diagnose import surfaces  # noqa: E402

from fullgraph.diagnose import fixes  # noqa: E402
from fullgraph.diagnose.configs import short_dtype  # noqa: E402
from fullgraph.diagnose.doctor import doctor  # noqa: E402
from fullgraph.diagnose.inputs import Example  # noqa: E402

BUDGET_S = 120.0  # the acceptance's budget per model
PART_S = 540.0  # one device call's share of its 10 minutes: start, imports and a margin take the rest
CHECKS = ("terminal", "html", "json", "advice", "checklist", "with_fix_breaks", "with_fix_rows", "advice_rows",
          "ceilings", "detections", "budget")  # fmt: skip
HEADS = ("terminal", "HTML", "JSON", "advice", "checklist", "breaks with fix (explain)", "rows with fix",
         "advice names only rows run", "rates vs ceiling", "detections matched",
         "rows skipped by the budget")  # fmt: skip
FIELDS = ["model", "group", "explain_breaks", "explain_with", "doctor_breaks", "places", "skipped_frames",
          "recompiles", "recommendation", "speedup", "baseline", "breakdown", "configs_failed", *CHECKS,
          "failed_checks", "budget_s", "doctor_s", "wall_s", "error"]  # fmt: skip


def explain(fn, args: tuple, kwargs: dict, dtype: torch.dtype | None = None, names: tuple[str, ...] = ()) -> int | None:
    """explain's count on a fresh copy (set-once state, such as torchvision's pooler scales, is set through a break
    on the first call), in `dtype`, with our fixes `names` on; None when Dynamo fails. Dynamo is reset after: a
    frame Dynamo failed on stays marked to run eagerly, and the doctor would then see no break at all."""
    example = Example.of(args, kwargs)
    model = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    if dtype:
        model = model.to(dtype) if isinstance(model, torch.nn.Module) else model
        example = example.cast(dtype)
    try:
        with torch.no_grad(), fixes.applied(names):
            return torch._dynamo.explain(model)(*example.args, **example.kwargs).graph_break_count
    except Exception as e:
        print(f"  explain failed ({short_dtype(dtype) if dtype else 'as given'}): {str(e)[:200]}", file=sys.stderr)
        return None
    finally:
        torch._dynamo.reset()


def headline(report) -> str:
    """Where the time goes in the last profiled row (the recommended one): its largest class, share, flags."""
    if not report.breakdowns:
        return ""
    b = report.breakdowns[-1]
    top = max(b.classes, key=lambda c: c.ms, default=None)
    text = f"{b.label}: {top.name} {top.share:.0%} of {b.kernel_ms:.2f} ms" if top else b.label
    if b.idle_share is not None and b.idle_share > 0.2:
        text += f", GPU idle {b.idle_share:.0%}"
    return text + "".join(f"; {f.kind} {f.ms:.2f} ms" for f in b.flags)


def run_case(case: Case, device: torch.device, budget: float) -> tuple[dict, dict]:
    """(the CSV row, the report as a dict) for one model."""
    t0 = time.monotonic()
    row = {"model": case.name, "group": case.group, "budget_s": round(budget)}
    fn, args, kwargs = moved(*case.build(device), device)
    ref = explain(fn, args, kwargs)
    row["explain_breaks"] = -1 if ref is None else ref
    explain_with = {short_dtype(d): explain(fn, args, kwargs, d, case.with_) for d in case.dtypes} if case.with_ else {}
    row["explain_with"] = ";".join(f"{d}={'failed' if n is None else n}" for d, n in explain_with.items())
    say = lambda msg: print(f"  [{time.monotonic() - t0:6.1f}s] {case.name}: {msg}", file=sys.stderr)  # noqa: E731
    t1 = time.monotonic()
    report = doctor(fn, args, kwargs=kwargs, target=case.name, modes=case.modes, dtypes=case.dtypes, budget=budget,
                    reps=case.reps, progress=say, with_=case.with_)  # fmt: skip
    row["doctor_s"] = round(time.monotonic() - t1, 1)
    checks = surfaces.check(report, row["explain_breaks"], case.modes, case.dtypes, explain_with, case.detector)
    rec = report.recommendation
    row.update(
        doctor_breaks=report.graph_break_count,
        places=len(report.breaks),
        skipped_frames=len(report.skipped_frames),
        recompiles=sum(r.count for r in report.recompiles),
        recommendation=rec.config if rec else "",
        speedup=round(rec.speedup, 3) if rec and rec.speedup else "",
        baseline=rec.baseline if rec else "",
        breakdown=headline(report),
        configs_failed=sum(1 for c in report.configs if c.error),
        failed_checks=",".join(k for k, c in checks.items() if not c.ok),
        **{k: c.text for k, c in checks.items()},
        wall_s=round(time.monotonic() - t0, 1),
    )
    return row, report.to_dict()


def _cell(row: dict, key: str) -> str:
    text = str(row.get(key, "")).replace("|", "/")
    return f"**{text}**" if key in str(row.get("failed_checks", "")).split(",") else text


def markdown(rows: list[dict]) -> str:
    """The table docs/doctor.md holds: explain's count, then each surface's and each check's cell."""
    head = "| model | explain | " + " | ".join(HEADS) + " | s (doctor / all) |"
    lines = [head, "|" + "---|" * (len(HEADS) + 3)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['model']} | **error: {r['error'][:120]}** |" + " |" * (len(HEADS) + 1))
            continue
        ref = str(r["explain_breaks"]) + (
            f", {r['skipped_frames']} skipped frame(s)" if int(r["skipped_frames"]) else ""
        )
        cells = " | ".join(_cell(r, k) for k in CHECKS)
        lines.append(f"| {r['model']} | {ref} | {cells} | {r['doctor_s']} / {r['wall_s']} |")
    return "\n".join(lines)


def _failing(rows: list[dict]) -> list[str]:
    """The models with an error or a failed check, each with what failed."""
    return [f"{r['model']} ({'error' if r.get('error') else r['failed_checks']})" for r in rows
            if r.get("error") or r.get("failed_checks")]  # fmt: skip


def _nothing_rescued(rows: list[dict]) -> bool:
    """Fixes were measured, yet no model shows a row that failed as written running with them."""
    with_fixes = [r.get("with_fix_rows", "") for r in rows if r.get("explain_with")]
    return bool(with_fixes) and not surfaces.rescued_somewhere(with_fixes)


def verdict(rows: list[dict]) -> str:
    bad = _failing(rows)
    third_party = sum(1 for r in rows if r.get("group") in ACCEPTANCE and not r.get("error"))
    head = f"{len(rows)} model(s), {third_party} third-party run; every check holds on {len(rows) - len(bad)}"
    head += f"; not on: {', '.join(bad)}" if bad else ""
    if _nothing_rescued(rows):
        head += "; no model shows a row that failed as written running with our fixes"
    return head


def holds(rows: list[dict]) -> bool:
    """Every check on every model, and (where fixes were measured) a failed row that ran with them somewhere."""
    return not _failing(rows) and not _nothing_rescued(rows)


def write(rows: list[dict], reports: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump(reports, f, indent=1)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    meta = {"torch": torch.__version__, "gpu": gpu, "date": time.strftime("%Y-%m-%d")}
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS + list(meta), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, **meta})


def read(paths: list[str]) -> list[dict]:
    rows = []
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"doctor_models.py --from-csv: no file {p}")
        with open(p, newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def parts(cases: list[Case], limit: float) -> list[list[Case]]:
    """The cases in order, cut into parts whose estimates add up to at most `limit` seconds (one case a part at
    least)."""
    out: list[list[Case]] = [[]]
    for c in cases:
        if out[-1] and sum(x.est_s for x in out[-1]) + c.est_s > limit:
            out.append([])
        out[-1].append(c)
    return out


def command(cases: list[Case]) -> str:
    return f'DOCTOR_MODELS_ARGS="{" ".join(c.name for c in cases)}" bash benchmarks/h200.sh doctor-models'


def plan(cases: list[Case], limit: float) -> str:
    lines = [f"# {len(cases)} model(s), about {sum(c.est_s for c in cases) / 60:.0f} min of parts sharing one GPU, "
             f"in parts of at most {limit / 60:.1f} min; h200.sh's step doctor-models-streams runs three side by "
             "side in one device call (the seconds are then not comparable), or one call each:"]  # fmt: skip
    for i, p in enumerate(parts(cases, limit), 1):
        lines += [f"# part {i}: ~{sum(c.est_s for c in p) / 60:.1f} min", command(p)]
    lines.append("# then: PYTHONPATH=src python3 benchmarks/doctor_models.py --from-csv PART1.csv,PART2.csv,...")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="model names or groups (timm transformers torchvision detectors ours)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="the CPU stand-ins (tiny configs, the doctor's test models)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="the doctor's budget per model, seconds")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("DOCTOR_MODELS_DEADLINE", PART_S)),
                    help="start no model whose estimate would end past this many seconds; list the rest")  # fmt: skip
    ap.add_argument("--plan", action="store_true", help="print the commands that split the selection into parts")
    ap.add_argument("--from-csv", help="comma-separated CSVs of earlier parts: print their table, measure nothing")
    ap.add_argument("--csv", help="where to write the CSV (its .json beside it); default $OUT/doctor_models.csv")
    a = ap.parse_args(argv)
    if a.from_csv:
        rows = read(a.from_csv.split(","))
        print(markdown(rows) + "\n\n" + verdict(rows))
        return 0 if holds(rows) else 1
    cases = select(a.models, a.small)
    if a.plan:
        print(plan(cases, a.deadline))
        return 0
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("doctor_models.py: no CUDA GPU here; on the CPU run --small --device cpu", file=sys.stderr)
        return 2
    path = a.csv or (os.path.join(os.environ["OUT"], "doctor_models.csv") if os.environ.get("OUT") else None)
    start, rows, reports = time.monotonic(), [], {}
    for i, case in enumerate(cases):
        if rows and time.monotonic() - start + case.est_s > a.deadline:
            print(f"# --deadline {a.deadline:.0f} s: not started, run next:\n{command(cases[i:])}", file=sys.stderr)
            break
        print(f"=== {case.name} (budget {a.budget:.0f} s, estimate {case.est_s:.0f} s)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            row, reports[case.name] = run_case(case, device, a.budget)
        except Exception as e:  # one model failing is a result; the others still run
            print("".join(traceback.format_exception(e)[-6:]), file=sys.stderr)
            row = {"model": case.name, "group": case.group, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
            reports[case.name] = {"error": row["error"]}
        row.setdefault("wall_s", round(time.monotonic() - t0, 1))
        rows.append(row)
        if path:  # after every model: a device call cut at its time limit keeps what it measured
            write(rows, reports, path)
        torch._dynamo.reset()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(markdown(rows) + "\n\n" + verdict(rows))
    return 0 if holds(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
