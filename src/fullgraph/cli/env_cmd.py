"""`fullgraph env`: what this machine has and what can run on it.

Attention backends are one table with two answers each, both from the attention dispatch that `auto` uses:
installed (`availability`) and runs here (`serve_reason`, for the call `fullgraph.env` probes SDPA with). A probe
that disagrees with the dispatch is shown as such: it means the dispatch's capability table is wrong here.
"""

from __future__ import annotations

import json

SERVES = "it can serve the call"


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print one JSON object (every field named)")
    p.add_argument("--no-probe", action="store_true", help="skip the probes that launch a Triton kernel and SDPA")
    p.set_defaults(run=run)


def _mark(ok: bool) -> str:
    return "yes" if ok else "no "


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def format_report(r) -> str:
    gpu = "none (torch sees no CUDA device)"
    if r.gpu:
        gpu = f"{r.gpu} x{r.gpu_count}, compute capability {r.gpu_capability}, {r.gpu_memory_gib} GiB"
    rows = [
        ("fullgraph", r.fullgraph + (f" (git {r.git_commit})" if r.git_commit else "")),
        ("python", f"{r.python} on {r.platform}"),
        ("torch", r.torch + (f", built for CUDA {r.torch_cuda}" if r.torch_cuda else ", CPU build")),
        ("triton", r.triton or "not installed (pip install 'fullgraph[triton]')"),
        ("gpu", gpu),
        ("driver", r.driver or "-"),
        ("inductor cache", r.inductor_cache_dir),
        ("TRITON_INTERPRET", "set" if r.triton_interpret else "not set"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("")
    lines.append("Triton kernels")
    for p in (r.triton_gpu, r.triton_interpreter):
        lines.append(f"  {_mark(p.ok)} {p.name:<20} {p.detail}")
    return "\n".join(lines)


def attention_dispatch(device: str, probes: list) -> dict:
    """Per backend of `fullgraph.ops.attention`: installed, runs here (for the probes' call) and why, plus the
    choices `auto` has cached. `probes` are `fullgraph.env`'s SDPA probes on `device` (empty: not probed)."""
    from fullgraph import env
    from fullgraph.ops.attention_backends import BACKENDS, Spec, availability, cache_path, load_choices, serve_reason

    _, h, n, d = env.PROBE_SHAPE
    dtype = str(env.probe_dtype(device)).removeprefix("torch.")
    spec = Spec(device, 0 if device == "cuda" else None, dtype, h, h, d, n, n, True, False, "none")
    probed = {p.name: p for p in probes}
    backends = {}
    for name in BACKENDS:
        missing = availability(name)
        refusal = serve_reason(name, *spec)
        probe = probed.get(name)
        runs = not refusal
        detail = refusal or (probe.detail if probe else f"{SERVES} (per the capability table; not probed)")
        if probe is not None and probe.ok != runs:  # the capability table says otherwise than a real call
            detail = f"{refusal or SERVES}, but the probe {'ran it' if probe.ok else 'failed'}: {probe.detail}"
            runs = False
        backends[name] = {"installed": not missing, "runs": runs, "detail": detail}
    return {
        "device": device,
        "call": f"{dtype}, {h} heads, {n} tokens, head dim {d}",
        "backends": backends,
        "cache": cache_path(),
        "cached_choices": load_choices(),
    }


def format_dispatch(d: dict) -> str:
    from fullgraph.bench.table import format_table

    rows = [[name, _yes(b["installed"]), _yes(b["runs"]), b["detail"]] for name, b in d["backends"].items()]
    lines = [
        f"Attention backends on {d['device']} (fullgraph.ops.attention; runs here: for a {d['call']} call)",
        format_table(["backend", "installed", "runs here", "why / how"], rows),
        f"auto picks among those that run; its cached choices: {len(d['cached_choices'])} in {d['cache']}",
    ]
    lines += [f"  {key} -> {choice}" for key, choice in sorted(d["cached_choices"].items())]
    return "\n".join(lines)


def run(args) -> int:
    from fullgraph import env

    report = env.collect(probe=not args.no_probe)
    dispatch = attention_dispatch(report.attention_device, report.attention)
    if args.json:
        print(json.dumps({**report.to_dict(), "attention_dispatch": dispatch}, indent=2))
    else:
        print(format_report(report) + "\n\n" + format_dispatch(dispatch))
    return 0
