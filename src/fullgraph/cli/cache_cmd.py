"""`fullgraph cache warm TARGET --input SPEC --remote URL`: compile a model once to fill the fleet's remote cache, and
publish its precompiled code for replicas that start with `fullgraph.deploy.serve` (`--no-publish`: the cache only);
`fullgraph cache stats --remote URL`: what the cache holds, per torch cache: entries, sizes, fullgraph's hit counts.

The URL (redis:// or rediss://) may hold the password (redis://:PASSWORD@HOST:PORT/DB) or take --password; without
--remote, FULLGRAPH_REMOTE_CACHE. The signing key: --key or FULLGRAPH_REMOTE_CACHE_KEY (`warm` only).
"""

from __future__ import annotations

from fullgraph.cli._args import add_target_args


def _remote_args(p) -> None:
    p.add_argument("--remote", default=None, metavar="URL", help="redis://[:PASSWORD@]HOST:PORT/DB or rediss://; "
                   "default FULLGRAPH_REMOTE_CACHE")  # fmt: skip
    p.add_argument("--password", default=None, help="Redis' password (default: the URL's)")
    p.add_argument("--timeout", type=float, default=1.0, help="seconds to connect and per reply (default 1)")


def add_parser(sub, name: str, help_text: str) -> None:
    p = sub.add_parser(name, help=help_text, description=help_text)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    warm = actions.add_parser("warm", help="compile TARGET once with the remote cache on, filling it")
    add_target_args(warm)
    _remote_args(warm)
    warm.add_argument("--key", default=None, help="signing key (default FULLGRAPH_REMOTE_CACHE_KEY)")
    warm.add_argument("--preset", default="dev", help="fullgraph.compile preset, as the replicas use (default dev)")
    warm.add_argument("--no-publish", action="store_true",
                      help="fill the remote caches only; do not publish the precompiled code")  # fmt: skip
    warm.set_defaults(run=run_warm)
    stats = actions.add_parser("stats", help="entries, sizes and recorded hits per torch cache in Redis")
    _remote_args(stats)
    stats.set_defaults(run=run_stats)


def run_warm(args) -> int:
    import time

    import torch
    from torch import nn

    import fullgraph
    from fullgraph.cli.progress import progress_reporter
    from fullgraph.deploy.remote import remote_cache
    from fullgraph.diagnose.target import load_target
    from fullgraph.errors import UsageError
    from fullgraph.timing import resolve_device

    device = resolve_device(args.device)
    with progress_reporter() as say:
        fleet = remote_cache(args.remote, password=args.password, key=args.key, timeout=args.timeout)
        say(f"loading {args.target} on {device}")
        model, example = load_target(args.target, args.input, device)
        if not isinstance(model, nn.Module):
            raise UsageError(f"{args.target} is a function; fullgraph.compile takes an nn.Module (wrap it in one)")
        say(f"compiling with the remote cache {fleet.url} ({args.preset})")
        start = time.perf_counter()
        with torch.no_grad(), fleet:
            example.call(fullgraph.compile(model, args.preset))
            s = fleet.stats()
    took = time.perf_counter() - start
    print(f"{args.target}: compiled in {took:.1f} s; remote cache {s['url']}: {s['put']} entries written, "
          f"{s['hit']} hits, {s['miss']} misses, {s['refused']} refused")  # fmt: skip
    if s["off"]:
        print(f"nothing was written: {s['off']}")
        return 1
    if not args.no_publish:
        return _publish(args, model, example, say)
    return 0


def _publish(args, model, example, say) -> int:
    """The precompiled code for `fullgraph.deploy.serve` (positional inputs only, torch 2.11+)."""
    from fullgraph.deploy.precompile import NotPrecompilable, unsupported_reason
    from fullgraph.deploy.published import publish

    why = unsupported_reason() or ("the inputs are keywords; precompiled code takes positional inputs"
                                   if example.kwargs else None)  # fmt: skip
    if why:
        print(f"not published for fullgraph.deploy.serve: {why}")
        return 0
    say(f"precompiling for publication ({args.preset})")
    try:
        name, size = publish(model, example.args, args.remote, password=args.password, key=args.key,
                             preset=args.preset, timeout=args.timeout)  # fmt: skip
    except NotPrecompilable as e:  # the remote cache is filled all the same; replicas compile through it
        print(f"not published for fullgraph.deploy.serve: {e}")
        return 0
    print(f"published the precompiled code as {name} ({size / 1e6:.2f} MB): replicas start from it with "
          f"fullgraph.deploy.serve(model, inputs, URL, preset={args.preset!r})")  # fmt: skip
    return 0


def run_stats(args) -> int:
    import os

    from fullgraph.bench.table import format_table
    from fullgraph.deploy.remote import ENV_URL, entries, shown_url

    found = entries(args.remote, password=args.password, timeout=args.timeout)
    rows = [[name, r["entries"], f"{r['bytes'] / 1e6:.2f}", f"{r['largest'] / 1e6:.2f}", r["hits"]]
            for name, r in found.items()]  # fmt: skip
    total = [sum(r[k] for r in found.values()) for k in ("entries", "bytes", "hits")]
    rows.append(["total", total[0], f"{total[1] / 1e6:.2f}", "", total[2]])
    print(f"remote cache {shown_url(args.remote or os.environ.get(ENV_URL, ''))}")
    print(format_table(["torch cache", "entries", "MB", "largest MB", "hits (fullgraph)"], rows))
    return 0
