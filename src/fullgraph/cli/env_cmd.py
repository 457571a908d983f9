"""`fullgraph env`: what this machine has and what can run on it."""

from __future__ import annotations

import json


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print one JSON object (every field named)")
    p.add_argument("--no-probe", action="store_true", help="skip the probes that launch a Triton kernel and SDPA")
    p.set_defaults(run=run)


def _mark(ok: bool) -> str:
    return "yes" if ok else "no "


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
    lines.append("")
    lines.append(f"Attention backends on {r.attention_device}")
    if not r.attention:
        lines.append("  (not probed: --no-probe)")
    for p in r.attention:
        lines.append(f"  {_mark(p.ok)} {p.name:<20} {p.detail}")
    return "\n".join(lines)


def attention_dispatch() -> dict:
    """What `fullgraph.ops.attention(backend="auto")` can use here, and the choices it has cached."""
    from fullgraph.ops.attention_backends import BACKENDS, availability, cache_path, load_choices

    return {
        "backends": {b: availability(b) or "installed" for b in BACKENDS},
        "cache": cache_path(),
        "cached_choices": load_choices(),
    }


def format_dispatch(d: dict) -> str:
    lines = ["fullgraph.ops.attention backends (auto picks among those that can serve each call)"]
    lines += [f"  {_mark(why == 'installed')} {name:<20} {why}" for name, why in d["backends"].items()]
    lines.append(f"  auto's cached choices: {len(d['cached_choices'])} in {d['cache']}")
    lines += [f"    {key} -> {choice}" for key, choice in sorted(d["cached_choices"].items())]
    return "\n".join(lines)


def run(args) -> int:
    from fullgraph import env

    report = env.collect(probe=not args.no_probe)
    dispatch = attention_dispatch()
    if args.json:
        print(json.dumps({**report.to_dict(), "attention_dispatch": dispatch}, indent=2))
    else:
        print(format_report(report) + "\n\n" + format_dispatch(dispatch))
    return 0
