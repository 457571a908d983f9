"""`fullgraph lint PATH...`: static checks of forward code for graph breaks and recompiles.

Exit status: 0 when clean, 1 when there are findings, 2 on bad input (a missing path, a file that does not parse,
an unknown rule id), which the lint raises as FullgraphError for main() to print.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from fullgraph.diagnose.rules import RULES


def add_parser(sub, name: str, help_text: str) -> None:
    rules = "\n".join(f"  {r.id}  {r.name}" for r in RULES)
    p = sub.add_parser(
        name,
        help=help_text,
        description=f"{help_text}. Silence a line with `# fullgraph: ignore[FG003]` (or a bare `# fullgraph: ignore`).",
        epilog=f"rules (docs/rules.md says why each one breaks or recompiles, and the fix):\n{rules}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, or directories to search for *.py")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text lines (default) or a JSON list")
    p.add_argument("--select", metavar="FG001,...", help="report only these rules (comma-separated ids)")
    p.set_defaults(run=run)


def run(args) -> int:
    from fullgraph.diagnose.lint import check_select, lint_paths, python_files

    select = check_select(args.select.split(",") if args.select else None)  # a bad id fails before any file is read
    files = python_files(args.paths)
    findings = lint_paths(files, select)
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=2))
        return 1 if findings else 0
    for f in findings:
        print(f"{f.path}:{f.line}:{f.col}: {f.rule} {f.message} (fix: {f.fix})")
    noun = "file" if len(files) == 1 else "files"
    if findings:
        affected = len({f.path for f in findings})
        print(f"{len(findings)} finding{'s' * (len(findings) != 1)} in {affected} of {len(files)} {noun}")
    else:
        print(f"no findings in {len(files)} {noun}")
    return 1 if findings else 0
