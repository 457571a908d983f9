"""Why the doctor's break count with our NMS fix differs from explain's on torchvision's detectors (issue 34).

H100, 2026-12-06 (`results/doctor_models_34*_h100.*`): as written every surface states explain's count (Faster R-CNN
27, Mask R-CNN 49, RetinaNet 5), but with `with_=("nms",)` the doctor read 19 / 30 / 4 where explain with the fix
on reads 21 / 43 / 5. The doctor reads them after its as-written capture, in the same process, without resetting
Dynamo, then with the recompile limit raised; explain resets first. (Answer, H200: a capture after a reset sees
explain's graphs; one after the as-written capture sees fewer, as frames at their recompile limit run eagerly. The
doctor now resets Dynamo before it reads the breaks with the fixes.) This counts the breaks with the fix four ways:
  explain        explain on a fresh copy after a reset (the reference)
  clean          our capture on a fresh copy after a reset
  after          our capture after an as-written capture of the model (the doctor's order), torch's recompile limit
  after+room     the same with the limit raised (what the doctor does)
and prints, for each, the count and the places that differ from explain's.

  PYTHONPATH=src python3 benchmarks/probes/with_fix_probe.py retinanet_resnet50_fpn [fasterrcnn_resnet50_fpn ...]
"""

from __future__ import annotations

import copy
import os
import sys
from collections import Counter

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]

from doctor_cases import moved, select  # noqa: E402

from fullgraph.diagnose import dynamo, fixes  # noqa: E402
from fullgraph.diagnose.inputs import Example  # noqa: E402


def places(breaks) -> Counter:
    return Counter(f"{os.path.basename(b.file)}:{b.line}" for b in breaks)  # explain words its reasons otherwise


def main(names: list[str]) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = all(n.startswith(("stand_in", "test_")) for n in names)  # the CPU stand-ins, to try this on a CPU
    for case in select(names, small):
        fn, args, kwargs = moved(*case.build(device), device)
        example = Example.of(args, kwargs)
        names_ = case.with_ or ("nms",)
        torch._dynamo.reset()
        with torch.no_grad(), fixes.applied(names_):
            ex = torch._dynamo.explain(copy.deepcopy(fn))(*example.args, **example.kwargs)
        ref = Counter(
            f"{os.path.basename(r.user_stack[-1].filename)}:{r.user_stack[-1].lineno}"
            if r.user_stack
            else r.reason.splitlines()[0][:60]
            for r in ex.break_reasons
        )
        fixed = "+".join(names_)
        print(f"=== {case.name}: explain with {fixed}: {ex.graph_break_count} breaks, {ex.graph_count} graphs")
        for way in ("clean", "after", "after+room"):
            torch._dynamo.reset()
            if way != "clean":
                dynamo.capture_breaks(fn, example.fresh())  # the doctor's as-written capture first
            fresh = copy.deepcopy(fn)
            room = dynamo.room_for_recompiles() if way == "after+room" else torch.no_grad()
            with room, fixes.applied(names_):
                rec, _ = dynamo.capture_breaks(fresh, example.fresh())
            got = places(rec.breaks)
            diff = {k: (got[k], ref[k]) for k in got | ref if got[k] != ref[k]}
            print(f"  {way:11s} {len(rec.breaks):3d} breaks, {len(rec.graphs)} graphs; differs from explain at:")
            for k, (a, b) in sorted(diff.items()):
                print(f"      {a:3d} vs {b:3d}  {k}")
        torch._dynamo.reset()


if __name__ == "__main__":
    main(sys.argv[1:] or ["retinanet_resnet50_fpn"])
