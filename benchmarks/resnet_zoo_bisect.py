"""Which step of `bench zoo`'s flow makes fullgraph.compile's default mode lose on ResNet-50 b4 (issue 33)?

`bench zoo` measured torchvision ResNet-50 b4 bf16 (default mode) at 0.63x plain torch.compile on an H100
(results/zoo_torchvision_h100.*: plain 1.52 ms, fullgraph 2.41 ms; timm's ResNet-50 at 0.52-0.73x), while
`resnet_host_probe.py`, which compiles the same call its own way, found 0.96-1.0x (results/resnet_host_probe_h100.txt).
Both are host-bound (reduce-overhead ran at 0.99x). So something in the zoo's flow, not in fullgraph's compile,
costs ~0.9 ms a call. Each step below runs in a fresh process and changes one thing from the zoo's flow:

- `cli`: `fullgraph bench zoo` itself at this one point (the ground truth: it lost there);
- `cli-inproc`: the same command line called in this process (`fullgraph.cli.main.main`), the CPU events of its
  timed calls profiled (if this loses and `parser` does not, the cost is in the command's run, not its imports; if
  it does not lose, in `python -m fullgraph` itself);
- `parser`: every command's module imported first (`build_parser()`, as the command line does), then the zoo's flow
  as `zoo` runs it;
- `zoo`: the zoo's own `_build` and `_measure` inside `capture_output()`, as the command line runs them (every
  warning counted at every occurrence: a warning that torch shows once would cost its machinery at every call);
  the warnings and log records caught while timing are listed;
- `zoo-bare`: the same without the capture;
- `copy`: the same steps written out here, under the capture (must agree with `zoo`, else the copy misses
  something);
- `ours-first`: fullgraph's model compiled and called before the plain ones;
- `no-reset`: without `torch._dynamo.reset()` before the compiles;
- `no-reference`: the fp32 reference model off the GPU once the expected output is computed;
- `no-eager`: the eager call before the compiles left out;
- `rewrites-none`: fullgraph.compile with rewrites=() (no pre-grad pass, no options).

Per step: plain and fullgraph ms (interleaved rounds, as the zoo times), their ratio, fullgraph's compiled function
called without its wrapper (`inner`), and, under torch.profiler,
the CPU events per forward whose count or self time differ most between the two, so the extra work is named.

Usage (GPU): PYTHONPATH=src python3 benchmarks/resnet_zoo_bisect.py [--model torchvision/resnet50] [--batch 4]
A dry run on the CPU (the zoo's small stand-in model, fp32): --device cpu.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

STEPS = (
    "cli",
    "cli-inproc",
    "parser",
    "zoo",
    "zoo-bare",
    "copy",
    "ours-first",
    "no-reset",
    "no-reference",
    "no-eager",
    "rewrites-none",
)


def one(step: str, model: str, batch: int, device_name: str, reps: int) -> dict:
    """Run `step` in this process; its figures."""
    import torch

    from fullgraph._capture import capture_output
    from fullgraph.bench.suites import zoo, zoo_models
    from fullgraph.timing import resolve_device

    device = resolve_device(device_name)
    if step == "cli-inproc":
        return _cli_inproc(model, batch, device, reps)
    if step == "parser":
        from fullgraph.cli.main import build_parser

        build_parser()
        step = "zoo"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    entry = next(e for e in (*zoo_models.MODELS, *zoo_models.SMALL) if e.name == model)
    library, why = zoo_models.import_library(entry.library)
    if why:
        raise SystemExit(why)
    models = zoo._build(entry, library, device, dtype)
    torch.manual_seed(batch)
    inputs = entry.inputs(batch)
    args32, kwargs32 = zoo._to(inputs, device, torch.float32)
    with torch.no_grad(), zoo.full_fp32():
        expected = zoo_models.primary_output(models["reference"](*args32, **kwargs32)).float()
    if step == "no-reference":
        models["reference"].cpu()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    low = zoo._to(inputs, device, dtype)
    settings = zoo.Settings(device, dtype, ("default",), reps, "dev", () if step == "rewrites-none" else "auto",
                            False)  # fmt: skip
    if step in ("zoo", "zoo-bare"):
        p = zoo.Point(entry.name, batch, "default")
        with capture_output() if step == "zoo" else contextlib.nullcontext() as caught:
            zoo._measure(p, models, low, expected, settings, lambda what: None)
        said = caught.summary() if caught is not None else []
        return {"step": step, "plain": p.ms["plain"], "fullgraph": p.ms["fullgraph"], "events": {}, "caught": said}
    with capture_output() as caught:
        return _steps(step, models, low, device, reps, caught)


def _cli_inproc(model: str, batch: int, device, reps: int) -> dict:
    """`fullgraph bench zoo` at the point through the command line's main() in this process; the CPU events per
    forward of plain and fullgraph profiled right after the zoo timed them (its timer wrapped)."""
    import tempfile

    from fullgraph.bench.suites import zoo
    from fullgraph.cli.main import main as cli_main

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from resnet_host_probe import op_counts

    events: dict = {}
    timer = zoo.round_medians

    def timed_then_profiled(part, **kw):
        medians = timer(part, **kw)
        if "plain" in part and "fullgraph" in part:
            events.update({name: op_counts(lambda x, fn=part[name]: fn(), None, device.type) for name in
                           ("plain", "fullgraph")})  # fmt: skip
        return medians

    zoo.round_medians = timed_then_profiled
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "zoo.csv")
        cli_main(zoo_argv(model, batch, reps, str(device), csv))
        ms = zoo_ms(csv)
    if "plain" not in ms or "fullgraph" not in ms:
        raise SystemExit("cli-inproc: the command line measured nothing")
    return {"step": "cli-inproc", "plain": ms["plain"], "fullgraph": ms["fullgraph"], "events": events, "caught": []}


def _steps(step, models, low, device, reps, caught) -> dict:
    import torch

    import fullgraph.compile
    from fullgraph.bench.suites import zoo
    from fullgraph.timing import round_medians

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from resnet_host_probe import op_counts

    (a, kw) = low
    if step != "no-reset":
        torch._dynamo.reset()
    rewrites = () if step == "rewrites-none" else "auto"
    ours = fullgraph.compile(models["fullgraph"], "dev", mode="default", rewrites=rewrites, approximate_gelu=False)
    calls = {"eager": models["plain"], "plain": torch.compile(models["plain"]),
             "plain again": torch.compile(models["plain again"]), "fullgraph": ours}  # fmt: skip
    if step == "ours-first":
        calls = {"fullgraph": ours, **{k: v for k, v in calls.items() if k != "fullgraph"}}
    if step == "no-eager":
        del calls["eager"]
    with torch.no_grad():
        for fn in calls.values():
            fn(*a, **kw)
        calls["inner"] = ours.__dict__["_compiled"]  # fullgraph's compiled function without its wrapper
        part = {name: (lambda fn=calls[name]: fn(*a, **kw)) for name in (*zoo.COMPILED, "inner")}
        medians = round_medians(part, device=device, rounds=zoo.ROUNDS, reps=reps)
        events = {name: op_counts(lambda x, fn=calls[name]: fn(*a, **kw), None, device.type) for name in
                  ("plain", "fullgraph")}  # fmt: skip
    return {"step": step, "plain": statistics.median(medians["plain"]),
            "fullgraph": statistics.median(medians["fullgraph"]), "inner": statistics.median(medians["inner"]),
            "events": events, "caught": caught.summary()}  # fmt: skip


def differences(events: dict, top: int = 8) -> list[str]:
    """The CPU events whose per-forward count or self time differ most between plain and fullgraph."""
    if not events:
        return []
    plain, ours = events["plain"], events["fullgraph"]
    keys = set(plain) | set(ours)

    def gap(k: str) -> float:
        return abs(ours.get(k, (0, 0))[1] - plain.get(k, (0, 0))[1])

    lines = []
    for k in sorted(keys, key=gap, reverse=True)[:top]:
        (pc, pu), (oc, ou) = plain.get(k, (0, 0)), ours.get(k, (0, 0))
        lines.append(f"    {k[:58]:58s} plain {pc:6.1f} x {pu:8.1f} us | fullgraph {oc:6.1f} x {ou:8.1f} us")
    return lines


def zoo_argv(model: str, batch: int, reps: int, device: str, csv: str) -> list[str]:
    """`fullgraph bench zoo`'s arguments (after the program) for the one point, its rows into `csv`."""
    return ["bench", "zoo", "--models", model, "--batches", str(batch), "--modes", "default", "--reps", str(reps),
            "--device", device, "--csv", csv, *(["--small"] if model.startswith("small/") else [])]  # fmt: skip


def zoo_ms(csv: str) -> dict[str, float]:
    """Each variant's median ms in a zoo CSV (none when the command wrote no file)."""
    from fullgraph.bench.results import read_csv

    return {r.variant: r.value for r in read_csv(csv) if r.metric == "median_ms"} if os.path.exists(csv) else {}


def _cli(model: str, args) -> str:
    """`fullgraph bench zoo` at the one point, in its own process: its line of this table."""
    import tempfile

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "zoo.csv")
        argv = [sys.executable, "-m", "fullgraph", *zoo_argv(model, args.batch, args.reps, args.device, csv)]
        done = subprocess.run(argv, capture_output=True, text=True)
        ms = zoo_ms(csv)
    took = time.perf_counter() - start
    if "plain" not in ms or "fullgraph" not in ms:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{'cli':14s} failed (exit {done.returncode}): {tail[:150]}"
    return (f"{'cli':14s} {ms['plain']:9.3f} {ms['fullgraph']:13.3f} {ms['plain'] / ms['fullgraph']:16.3f} "
            f"{'-':>9s} {took:6.0f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a zoo model (default torchvision/resnet50; CPU: small/patch_mlp)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = args.model or ("torchvision/resnet50" if args.device == "cuda" else "small/patch_mlp")
    if args.one:
        print("RESULT " + json.dumps(one(args.one, model, args.batch, args.device, args.reps)), flush=True)
        return
    print(f"{model} b{args.batch}, default mode, {args.device}: each step a fresh process")
    print(f"{'step':14s} {'plain ms':>9s} {'fullgraph ms':>13s} {'fullgraph/plain':>16s} {'inner ms':>9s} {'s':>6s}")
    for step in args.steps.split(","):
        start = time.perf_counter()
        if step == "cli":
            print(_cli(model, args), flush=True)
            continue
        argv = [sys.executable, os.path.abspath(__file__), "--one", step, "--model", model, "--batch",
                str(args.batch), "--reps", str(args.reps), "--device", args.device]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True)
        found = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if not found:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{step:14s} failed (exit {done.returncode}): {tail[:150]}", flush=True)
            continue
        r = json.loads(found[-1][len("RESULT ") :])
        inner = f"{r['inner']:9.3f}" if r.get("inner") else f"{'-':>9s}"
        print(f"{step:14s} {r['plain']:9.3f} {r['fullgraph']:13.3f} {r['plain'] / r['fullgraph']:16.3f} {inner} "
              f"{time.perf_counter() - start:6.0f}", flush=True)  # fmt: skip
        for line in differences(r["events"]):
            print(line, flush=True)
        for line in r.get("caught", [])[:6]:
            print(f"    caught: {line[:150]}", flush=True)


if __name__ == "__main__":
    main()
