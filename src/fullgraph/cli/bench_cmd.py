"""`fullgraph bench SUITE`: run a suite, print its table, append its rows to a CSV.

The suites' arguments are declared here, as data, so building the command line imports neither torch nor the
suites (every `fullgraph` call builds the whole parser); a suite module is imported only to run it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings

from fullgraph.cli._args import TARGET_HELP

# suite -> (module with run(args) -> (rows, table) or (rows, table, failure), description, extra arguments as
# (flags, argparse kwargs))
SUITES = {
    "ceilings": (
        "fullgraph.bench.suites.ceilings",
        "copy bandwidth (TB/s) and GEMM rate (TFLOP/s) of this device",
        [
            ("--copy-mib", {"type": int, "help": "copied buffer size (default 2048 on GPU, 64 on CPU)"}),
            ("--gemm-n", {"type": int, "help": "square GEMM size (default 8192 on GPU, 1024 on CPU)"}),
        ],
    ),
    "ops": (
        "fullgraph.bench.suites.ops",
        "norms, RoPE and modulation: eager, built-in, compiled and kernel, in TB/s",
        [
            ("--ops", {"help": "comma-separated subset of the suite's ops (default: all)"}),
            ("--shapes", {"help": "rows x cols list, e.g. 16384x4096,65536x128 (default: 3 shapes)"}),
            ("--dtype", {"default": "bf16", "choices": ["bf16", "fp16", "fp32"]}),
            ("--markdown", {"help": "also write the table as markdown to this file"}),
        ],
    ),
    "attention": (
        "fullgraph.bench.suites.attention",
        "every attention backend per point (ViT/DiT shapes, 197-16384 tokens), TFLOP/s, and auto's choice",
        [
            ("--seqs", {"help": "sequence lengths, e.g. 197,4096 (default 197,1024,4096,16384; 77 on CPU)"}),
            ("--dtype", {"default": "bf16", "choices": ["bf16", "fp16", "fp32"]}),
        ],
    ),
    "vit": (
        "fullgraph.bench.suites.vit",
        "the ViT case study: timm (or the plain twin) eager and compiled against ours, per batch size",
        [
            ("--batches", {"help": "batch sizes, e.g. 1,4,256 (default 1,4,256 on GPU; 2 on CPU)"}),
            (
                "--config",
                {"help": "vit_tiny, vit_small, vit_b16 or vit_l16 (default vit_b16 on GPU, a small one on CPU)"},
            ),
            ("--modes", {"help": "compile modes, e.g. default,reduce-overhead (default: both on GPU, default on CPU)"}),
            ("--presets", {"help": "fullgraph.compile presets, e.g. perception,dev (default; dev on CPU) or none"}),
            ("--dtype", {"default": None, "choices": ["bf16", "fp16", "fp32"], "help": "default bf16 on GPU"}),
            ("--breakdown", {"action": "store_true", "help": "where the GPU time goes, reference and ours compiled"}),
            (
                "--policies",
                {
                    "default": None,
                    "help": "more variants: the first preset's model called under each op policy (FULLGRAPH_OPS "
                    "spec), separated by ';' (e.g. 'attention=kernel'); with --breakdown, profiled too",
                },
            ),
        ],
    ),
    "coldstart": (
        "fullgraph.bench.suites.coldstart",
        "time to first output in fresh processes: cold compile, warm cache, cache artifacts, AOT package, precompiled",
        [
            (
                "--model",
                {"help": "vit_mini, vit_tiny, vit_small, vit_b16 or dit_s (default vit_b16 on GPU, vit_mini on CPU)"},
            ),
            ("--batch", {"type": int, "help": "batch size (default 4 on GPU, 2 on CPU)"}),
            ("--dtype", {"default": None, "choices": ["bf16", "fp16", "fp32"], "help": "default bf16 on GPU"}),
            ("--preset", {"help": "fullgraph.compile preset (default perception on GPU, dev on CPU)"}),
            ("--depth", {"type": int, "help": "blocks (default: the model's)"}),
            ("--routes", {"help": "subset of cold,warm,artifacts,package,precompiled (default: all; warm needs cold)"}),
            ("--timeout", {"type": float, "help": "seconds one process may take (default 900)"}),
            ("--workdir", {"help": "work in this new folder and keep it: caches, package, each process's log"}),
        ],
    ),
    "dit": (
        "fullgraph.bench.suites.dit",
        "the DiT stack from our ops against its plain-PyTorch twin: compiled (auto, kernel, native, fusions) and eager",
        [
            ("--tokens", {"help": "token counts, e.g. 1024,4096 (default 1024,4096,16384 on GPU; 64 on CPU)"}),
            (
                "--mode",
                {
                    "choices": ["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                    "default": None,
                    "help": "torch.compile mode of every compiled variant",
                },
            ),
            ("--config", {"help": "dit_s, dit_b, dit_xl or dit_3072 (default dit_3072 on GPU, a small one on CPU)"}),
            ("--depth", {"type": int, "help": "blocks (default: the config's)"}),
            (
                "--rope",
                {
                    "choices": ["1d", "video"],
                    "default": "1d",
                    "help": "RoPE positions: 1d, or video (N/1024 frames of 32x32 tokens; one --tokens count, a "
                    "multiple of 1024)",
                },
            ),
            ("--batch", {"type": int, "default": 1, "help": "batch size (default 1)"}),
            ("--dtype", {"default": None, "choices": ["bf16", "fp16", "fp32"], "help": "default bf16 on GPU"}),
            ("--breakdown", {"action": "store_true", "help": "where the GPU time goes, plain and ours compiled"}),
            (
                "--policies",
                {
                    "default": None,
                    "help": "more compiled variants of ours, each a FULLGRAPH_OPS spec, separated by ';' (e.g. "
                    "'all=auto,+qk_norm_rope,+layer_norm_modulate'); with --breakdown, profiled too",
                },
            ),
        ],
    ),
    "nms": (
        "fullgraph.bench.suites.nms",
        "batched NMS with a fixed capacity: torchvision against ours eager, compiled and under CUDA graphs, exactness",
        [
            ("--boxes", {"help": "boxes per image, e.g. 1000,10000 (default 1000,10000 on GPU; 200 on CPU)"}),
            ("--batches", {"help": "images per batch, e.g. 1,8 (default 1,8 on GPU; 4 on CPU)"}),
            ("--iou", {"type": float, "default": 0.5, "help": "IoU threshold, both sides (default 0.5)"}),
            ("--score-threshold", {"type": float, "default": 0.05, "help": "scores at or below are dropped (0.05)"}),
            ("--top-k", {"type": int, "default": 1000, "help": "best boxes per image that NMS sees (default 1000)"}),
            ("--capacity", {"type": int, "default": 100, "help": "kept boxes per image at most (default 100)"}),
        ],
    ),
    "robot": (
        "fullgraph.bench.suites.robot",
        "the robot model over a stream of varying requests: eager, whole compiled (dynamic, declared dims), the plan",
        [
            ("--config", {"help": "robot_tiny or robot_base (default robot_base on GPU, robot_tiny on CPU)"}),
            ("--n", {"type": int, "help": "requests in the timed stream (default 200 on GPU, 12 on CPU)"}),
            ("--warmup", {"type": int, "default": 2, "help": "warm-up requests per way, the first one square (2)"}),
            ("--ways", {"help": "comma-separated subset of eager,dynamic,declared,plan (default: all four)"}),
            ("--dtype", {"default": "fp32", "choices": ["fp32", "bf16"]}),
            ("--seed", {"type": int, "default": 0, "help": "seed of the weights and the stream (default 0)"}),
        ],
    ),
    "load": (
        "fullgraph.bench.suites.load",
        "one callable from many threads at once: throughput, p50/p99 latency, wrong outputs, exceptions, GPU memory",
        [
            ("target", {"help": f"{TARGET_HELP}; or a package FILE.pt2"}),
            (
                "--input",
                {
                    "action": "append",
                    "default": [],
                    "metavar": "SPEC",
                    "help": "an input, e.g. 4x3x224x224:bf16; name=SPEC for a keyword input; repeat for several "
                    "(default: the TARGET's, or the inputs a package was exported with)",
                },
            ),
            ("--threads", {"default": "1,4,16", "help": "thread counts, each measured in turn (default 1,4,16)"}),
            ("--seconds", {"type": float, "default": 30.0, "help": "timed seconds per thread count (default 30)"}),
            (
                "--rounds",
                {
                    "type": int,
                    "help": "warm runs: the thread counts take turns this many times, each for seconds / rounds, "
                    "and x 1 thread is the median of each round's ratio, so that a drift over the run (clocks, "
                    "the host) does not read as a threading effect (default 3; cold runs: 1)",
                },
            ),
            (
                "--callable",
                {
                    "help": "what wraps the model, or several in turn (comma-separated): compiled (default), "
                    "bucketed, precompiled, package (the default for a .pt2), serial, owner, nogil (a package with "
                    "the GIL released; nogil-locked: behind one lock), plain (torch.compile), locked or eager"
                },
            ),
            ("--package", {"metavar": "FILE.pt2", "help": "the package for --callable package (default: exported)"}),
            (
                "--preset",
                {
                    "help": "fullgraph.compile preset, its mode for precompiled and plain (default perception "
                    "on GPU, dev on CPU)"
                },
            ),
            (
                "--cold",
                {
                    "action": "store_true",
                    "help": "a fresh callable per thread count, its first call from every thread at once "
                    "(default: warmed up in one thread first)",
                },
            ),
            ("--cuda-graphs", {"action": "store_true", "help": "a package's calls replayed from CUDA graphs"}),
            (
                "--runners",
                {"type": int, "default": 1, "help": "a package's model instances (deploy.load's runners=; default 1)"},
            ),
            ("--input-sets", {"type": int, "default": 8, "help": "distinct random input sets (default 8)"}),
            (
                "--memory-calls",
                {
                    "type": int,
                    "default": 0,
                    "metavar": "N",
                    "help": "warm runs on a GPU: read each callable's memory over at least N calls, calling it "
                    "untimed from the largest thread count after the timed rounds where they made fewer "
                    "(default 0: the timed calls)",
                },
            ),
        ],
    ),
    "sweep": (
        "fullgraph.bench.suites.sweep",
        "issue 32's grid (DiT by head dim, ViT B/L/H/S), ours auto against the plain twin, a process per point",
        [
            ("--modes", {"help": "compile modes, e.g. default (default: default,reduce-overhead)"}),
            ("--only", {"help": "comma-separated substrings of point labels to run, e.g. 'dit 1152x16,vit_b16 b4'"}),
            ("--write-decisions", {"metavar": "FILE", "help": "write the DiT points' per-op decision data here"}),
            ("--depth", {"type": int, "help": "DiT blocks per point (default 4; 28 is DiT-XL/2's full depth)"}),
            (
                "--ops",
                {
                    "help": "time only these ops' one-kernel variants, e.g. layer_norm_modulate (default: all five; "
                    "none with --verify)"
                },
            ),
            ("--small", {"action": "store_true", "help": "one tiny DiT and one tiny ViT point (a CPU smoke run)"}),
            (
                "--resume",
                {
                    "action": "store_true",
                    "help": "skip the points whose rows --csv holds already (this GPU and torch, at least these "
                    "ops and depth): the same command sent again carries on",
                },
            ),
            (
                "--verify",
                {
                    "action": "store_true",
                    "help": "DiT points time only plain, plain again, ours auto and all native (the verdict), not "
                    "the one-kernel variants the decisions are written from: 4 compiles a point instead of 8",
                },
            ),
            (
                "--deadline",
                {
                    "type": float,
                    "metavar": "SECONDS",
                    "help": "start no point that would end past this (by the mean point so far); prints the "
                    "--only for the rest",
                },
            ),
            (
                "--from-csv",
                {
                    "metavar": "A.csv,B.csv",
                    "help": "measure nothing: the summary of parts run apart (and --write-decisions from them)",
                },
            ),
            (
                "--prewarm",
                {
                    "type": int,
                    "default": 0,
                    "metavar": "JOBS",
                    "help": "first compile every selected point in JOBS processes at once, timing nothing, so that "
                    "the timed processes load their graphs from Inductor's cache (default 0: off)",
                },
            ),
        ],
    ),
    "fleet": (
        "fullgraph.bench.suites.fleet",
        "replica processes with empty local caches against one Redis: first output, remote hits, compile time saved",
        [
            ("--replicas", {"type": int, "default": 4, "help": "replica processes per variant (default 4)"}),
            (
                "--steady-rounds",
                {
                    "type": int,
                    "default": None,
                    "metavar": "N",
                    "help": "every replica stays alive after its first output and times N rounds of --reps calls, "
                    "the replicas in turn, so that all variants' steady states are measured over the same minutes "
                    "(default 5; 0: each replica times itself before it exits)",
                },
            ),
            (
                "--profile-calls",
                {
                    "type": int,
                    "default": None,
                    "metavar": "N",
                    "help": "after the steady rounds, each replica's kernels over N calls under torch's profiler "
                    "(default 20; 0: none): the kernels that differ most between the fastest and slowest replica",
                },
            ),
            (
                "--variants",
                {
                    "help": "cold (no remote cache: the baseline), sequential (one after another), together "
                    "(all at once), published (fullgraph.deploy.serve from published code); "
                    "default all four"
                },
            ),
            ("--model", {"help": "as coldstart's --model (default vit_b16 on GPU, vit_mini on CPU)"}),
            ("--batch", {"type": int, "help": "batch size (default 4 on GPU, 2 on CPU)"}),
            ("--dtype", {"default": None, "choices": ["bf16", "fp16", "fp32"], "help": "default bf16 on GPU"}),
            ("--preset", {"help": "fullgraph.compile preset (default perception on GPU, dev on CPU)"}),
            ("--depth", {"type": int, "help": "blocks (default: the model's)"}),
            (
                "--remote",
                {
                    "metavar": "URL",
                    "help": "a Redis of yours, redis://:PASSWORD@HOST:PORT (default: "
                    "a private redis-server for the run); databases 0 and 1 are used",
                },
            ),
            ("--timeout", {"type": float, "help": "seconds one process may take (default 900)"}),
        ],
    ),
    "zoo": (
        "fullgraph.bench.suites.zoo",
        "timm, transformers and torchvision models: eager, plain torch.compile (twice: the noise) and "
        "fullgraph.compile with its rewrites, per model, batch and mode",
        [
            (
                "--models",
                {
                    "help": "comma-separated model or library names, e.g. timm,transformers/BertModel "
                    "(default: all 14; with --small, the stand-ins)"
                },
            ),
            (
                "--batches",
                {
                    "help": "batch sizes for every model, e.g. 4,64, or per model or library, e.g. "
                    "'timm/resnet50=1,32;transformers=2,16' (default: each model's two)"
                },
            ),
            (
                "--modes",
                {"help": "compile modes, e.g. default (default: default,reduce-overhead on GPU; default on CPU)"},
            ),
            ("--dtype", {"default": None, "choices": ["bf16", "fp16", "fp32"], "help": "default bf16 on GPU"}),
            ("--preset", {"default": "dev", "help": "fullgraph.compile preset, its mode set per point (default dev)"}),
            ("--rewrites", {"default": "auto", "help": "auto (default), none, or rewrite names, e.g. patch_gemm"}),
            ("--approximate-gelu", {"action": "store_true", "help": "let an exact GELU become the tanh form"}),
            ("--small", {"action": "store_true", "help": "tiny stand-in models (a CPU run in seconds)"}),
            (
                "--prewarm",
                {
                    "type": int,
                    "default": 0,
                    "metavar": "JOBS",
                    "help": "first run every model once in JOBS processes at once, timing nothing, so that the timed "
                    "run loads its graphs from Inductor's cache (default 0: off)",
                },
            ),
            (
                "--from-csv",
                {
                    "metavar": "FILE,...",
                    "help": "measure nothing: the table and summary of the zoo rows in these CSVs (the parts of one "
                    "run, one per device call)",
                },
            ),
        ],
    ),
    "all": (
        "fullgraph.bench.suites.all_suites",
        "vit, nms, robot and dit one after another, each with its defaults, each table printed as it finishes",
        [],
    ),
}


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    for suite, (module, suite_help, extra) in SUITES.items():
        sp = suites.add_parser(suite, help=suite_help, description=suite_help)
        sp.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
        sp.add_argument("--reps", type=int, default=30, help="timed repetitions per measurement (default 30)")
        sp.add_argument("--csv", default=f"fullgraph_{suite}.csv", help="results file to append to (long format)")
        for flag, kwargs in extra:
            sp.add_argument(flag, **kwargs)
        sp.set_defaults(run=run, suite_module=module)


@contextlib.contextmanager
def _load_sources(args):
    """What `bench load` takes from the layers above bench: TARGETs read as `doctor` reads them, packages loaded as
    `fullgraph load` loads them, fullgraph.deploy's saves and loads, and this command's progress."""
    import torch

    from fullgraph import deploy
    from fullgraph.bench.suites.load import Sources
    from fullgraph.cli.export_cmd import recorded_specs
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.diagnose.target import inputs_from_specs, load_target
    from fullgraph.errors import UsageError

    def open_package(path, specs, **options):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            loaded = deploy.load(path, **options)
        if options.get("release_gil") and not loaded.gil_released:  # nogil measured as the GIL held: refused
            why = next((str(w.message) for w in said if "release_gil" in str(w.message)), "")
            raise UsageError(f"--callable nogil, nogil-serial or nogil-locked: "
                             f"{why or 'the package runs through torch loader'}")  # fmt: skip
        for w in said:  # the rest, as they would have been shown
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        device = torch.device(loaded.metadata.get("AOTI_DEVICE_KEY") or "cpu")
        return loaded, inputs_from_specs(specs or recorded_specs(loaded, os.path.basename(path)), device)

    with progress_reporter() as say:
        yield {"sources": Sources(load_target, open_package, deploy.export, deploy.save_precompiled,
                                  deploy.load_precompiled, say)}  # fmt: skip


@contextlib.contextmanager
def _fleet_sources(args):
    """What `bench fleet` takes from above bench: a private redis-server, and this command's progress."""
    from fullgraph.bench.suites.fleet import Sources
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.deploy.remote_server import redis_server

    with progress_reporter() as say:
        yield {"sources": Sources(redis_server, say)}


# suite -> a context around its run yielding the keyword arguments its run takes besides `args`: for a suite that needs
# what only the command line may import (DESIGN.md, Layers)
NEEDS = {"load": _load_sources, "fleet": _fleet_sources}
# Suites whose runs outlast a device call: they hand each point's rows to `save` as it finishes, so a run stopped
# by a time limit keeps what it measured (a sweep part cut at 200 s on the H100 lost two timed points).
SAVES_AS_IT_GOES = {"sweep", "zoo"}


class _Saved:
    """`save(rows)`: the rows appended to --csv at once; the run's other rows follow when it ends."""

    def __init__(self, path: str):
        self.path, self.count, self._ids = path, 0, set()

    def __call__(self, rows) -> None:
        from fullgraph.bench.results import append_csv

        rows = list(rows)
        self.count += append_csv(self.path, rows)
        self._ids.update(id(r) for r in rows)

    def rest(self, rows) -> list:
        return [r for r in rows if id(r) not in self._ids]


def run(args) -> int:
    from fullgraph._capture import capture_output
    from fullgraph.bench.results import append_csv

    # The suites' warnings and library logs (Dynamo's, Inductor's, transformers') are counted, not shown between
    # our lines: one line per kind follows the table (or the error). Progress that a suite prints still shows.
    needs = NEEDS.get(getattr(args, "suite", None), lambda args: contextlib.nullcontext({}))
    saved = _Saved(args.csv)
    try:
        with capture_output() as captured, needs(args) as extra:
            if getattr(args, "suite", None) in SAVES_AS_IT_GOES:
                extra = {**extra, "save": saved}
            # (rows, table), or (rows, table, failure): a one-line failure (wrong outputs, say) exits 1 after both
            rows, table, *failure = importlib.import_module(args.suite_module).run(args, **extra)
        print(table)
    finally:
        for line in captured.summary():
            print(line, file=sys.stderr)
    n = saved.count + append_csv(args.csv, saved.rest(rows))
    if n or not getattr(args, "from_csv", None):  # --from-csv measures nothing by design
        print(f"\n{n} rows appended to {args.csv}" if n else "\nno rows measured: nothing written")
    if failure and failure[0]:
        print(f"fullgraph bench {args.suite}: failed: {failure[0]}", file=sys.stderr)
        return 1
    return 0
