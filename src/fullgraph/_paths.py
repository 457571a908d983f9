"""Paths as users read them: short, and never a climb of `../../..` out of the current directory.

`display_path` is what every terminal and HTML line that names a file prints; `module_name` names the module a
source file is imported as (the source of a warning); `cache_dir` is fullgraph's own cache folder, for every layer.
"""

from __future__ import annotations

import functools
import os
import sys

SITE_DIRS = ("site-packages", "dist-packages")
# A directory holding one of these is a project's root (the nearest one above a file wins).
PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def cache_dir() -> str:
    """fullgraph's own cache folder (attention choices, decision data, package probes): FULLGRAPH_CACHE_DIR, else
    $XDG_CACHE_HOME/fullgraph, else ~/.cache/fullgraph."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("FULLGRAPH_CACHE_DIR") or os.path.join(xdg, "fullgraph")


def display_path(path: str | os.PathLike) -> str:
    """`path` for a reader: relative to the current directory when under it, else relative to the site-packages
    directory holding it (`transformers/models/bert/modeling_bert.py`), else relative to its project's root (the
    nearest directory above it with a pyproject.toml, setup.py, setup.cfg or .git), else absolute.

    Names that are not files (`<string>`, `<frozen importlib._bootstrap>`, "") come back unchanged.
    """
    text = os.fspath(path)
    if not text or text.startswith("<"):
        return text
    full = os.path.abspath(text)
    forms = tuple(dict.fromkeys((full, os.path.realpath(full))))  # a symlinked venv or checkout matches either
    for root in _roots(forms):
        for p in forms:
            rel = _relative(p, root)
            if rel is not None:
                return rel
    return full


def module_name(path: str | os.PathLike) -> str | None:
    """The dotted name a Python source file is imported as, from the deepest `sys.path` entry holding it
    (`.../site-packages/torch/_dynamo/utils.py` -> "torch._dynamo.utils"); None when none holds it."""
    full = os.path.abspath(os.fspath(path))
    stem, ext = os.path.splitext(full)
    if ext not in (".py", ".pyc", ".pyi"):
        return None
    best = None
    for entry in sys.path:
        root = os.path.abspath(entry) if entry else _cwd()
        rel = _relative(stem, root) if root else None
        if rel is not None and (best is None or len(rel) < len(best)):
            best = rel
    if best is None:
        return None
    parts = best.split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def _roots(forms: tuple[str, ...]) -> list[str]:
    """The directories to try, in order: site-packages (a library file reads `transformers/...` even from a venv
    inside the current directory), the current one, the project's root."""
    cwd = _cwd()
    sites = {os.path.abspath(e) for e in sys.path if e and os.path.basename(os.path.normpath(e)) in SITE_DIRS}
    roots = sorted(sites, key=len, reverse=True)  # a nested site-packages (a venv inside a venv) first
    roots += [cwd] if cwd else []
    roots += [r for r in (project_root(os.path.dirname(p)) for p in forms) if r is not None]
    return roots


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the current directory was removed
        return None


@functools.lru_cache(maxsize=256)
def project_root(folder: str) -> str | None:
    """The nearest directory at or above `folder` that holds a project marker, or None."""
    while True:
        if any(os.path.exists(os.path.join(folder, m)) for m in PROJECT_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _relative(path: str, root: str) -> str | None:
    """`path` relative to `root` when it lies under it (never `..`), else None."""
    try:
        if os.path.commonpath([path, root]) != root:
            return None
    except ValueError:  # different drives on Windows, or a relative path mixed in
        return None
    rel = os.path.relpath(path, root)
    return None if rel == os.curdir else rel
