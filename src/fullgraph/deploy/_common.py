"""What cache files and packages share: the error they raise, who may have written a file before it is loaded, how
one is written, and the description of this process that a file is checked against.

Cache artifacts and AOT packages are code: pickles that run when read, and shared libraries that run when loaded.
So a file is loaded only if no one but its owner can change it, and its owner is this user or root (the rule ssh
applies to its own files).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO, TypeVar

import torch

from fullgraph import env
from fullgraph._files import write_atomic_bytes
from fullgraph._paths import cache_dir, display_path  # noqa: F401  (cache_dir re-exported: on the floor for ops)
from fullgraph._version import __version__
from fullgraph.errors import FullgraphError
from fullgraph.serving import input_signature  # noqa: F401  (re-exported: deploy names inputs in errors and headers)


class DeployError(FullgraphError, RuntimeError):
    """A cache file or package that cannot be used here; the message names the cause and the fix."""


def environment() -> dict[str, str | None]:
    """What compiled code depends on in this process: versions, and the GPU (name and capability) or "cpu"."""
    cap = env.cuda_capability()
    return {
        "torch": torch.__version__,
        "triton": _triton_version(),
        "fullgraph": __version__,
        "device": torch.cuda.get_device_name(0) if cap else "cpu",
        "capability": f"{cap[0]}.{cap[1]}" if cap else None,
    }


def _triton_version() -> str | None:
    """`triton.__version__` (what the headers of files written before recorded) without importing Triton: a process
    that loads a package needs no compiler, and importing Triton costs it a few hundred milliseconds. Read from the
    literal in triton/__init__.py (the distribution's version can differ: a nightly's pytorch-triton says
    "3.3.0+git..." where its module says "3.3.0"); Triton is imported (`env.triton_version`) only when it already is
    or that literal is not found. None where Triton is not installed."""
    if "triton" in sys.modules or not (spec := importlib.util.find_spec("triton")) or not spec.origin:
        return env.triton_version()
    try:
        with open(spec.origin, encoding="utf-8") as f:
            found = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", f.read(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else env.triton_version()


def mismatches(saved: Mapping[str, Any], here: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """`"torch 2.11.0 there, 2.13.0 here"` for each key whose values differ."""
    return [f"{k} {saved.get(k)} there, {here.get(k)} here" for k in keys if saved.get(k) != here.get(k)]


# ---- trust: who may have written a file we are about to run -----------------------------------------------------


def _trusted_owner(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def _check_file(st: os.stat_result, path: str, what: str) -> None:
    shown = display_path(path)
    if not stat.S_ISREG(st.st_mode):
        raise DeployError(f"{shown} is not a regular file; give the path of a {what} file")
    if not _trusted_owner(st.st_uid):
        raise DeployError(
            f"refusing to load {shown}: it belongs to uid {st.st_uid}, not to you ({os.getuid()}) or root, and "
            f"a {what} runs code when loaded; check it and copy it to a file of yours"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
        raise DeployError(
            f"refusing to load {shown}: it is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}), and a {what} "
            f"runs code when loaded; if you trust its content: chmod go-w {path}"
        )


def _check_folder(path: str, what: str) -> None:
    """A folder others can write without the sticky bit lets them replace the file between our check and a load."""
    folder = os.path.dirname(os.path.realpath(path))
    st = os.stat(folder)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise DeployError(
            f"refusing to load {display_path(path)}: its folder {display_path(folder)} is writable by other users "
            f"(mode {stat.S_IMODE(st.st_mode):o}), who could swap the {what}; move it or chmod go-w the folder"
        )


def open_trusted(path: str | os.PathLike, what: str) -> BinaryIO:
    """Open `path` for reading after checking the opened file (not the name, which could be swapped meanwhile):
    a regular file, owned by this user or root, writable by no one else, in a folder others cannot write."""
    path = os.fspath(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except FileNotFoundError:
        raise DeployError(f"{display_path(path)} does not exist; give the path of a {what} file") from None
    except IsADirectoryError:
        raise DeployError(f"{display_path(path)} is a folder; give the path of a {what} file") from None
    try:
        _check_file(os.fstat(f.fileno()), path, what)
        _check_folder(path, what)
    except BaseException:
        f.close()
        raise
    return f


def write_private(path: str | os.PathLike, chunks: Iterable[bytes]) -> None:
    """Write `chunks` to `path` whole or not at all (`fullgraph._files.write_atomic_bytes`: beside it, then renamed
    over it; a full disk is a DiskFullError), with mode 0644 whatever the umask: a file that others can write would
    be refused by the loader."""
    write_atomic_bytes(path, chunks, mode=0o644)


Meta = TypeVar("Meta")


def read_framed(path: str | os.PathLike, *, what: str, kind: str, magic: bytes, fmt: int, meta_cls: type[Meta],
                fix: str, make: str, contents: str) -> tuple[Meta, bytes]:  # fmt: skip
    """A file written as `magic`, a JSON header (`meta_cls`'s fields, with "format", "payload_bytes" and
    "payload_sha256"), a newline and the payload: its header and payload after the ownership and permission
    checks, the format and the checksum; nothing is unpickled. Each refusal is one DeployError naming the cause and
    `fix` (`make`: the call that makes such a file; `what` / `kind` / `contents`: what the file is, its short name and
    what its payload is)."""
    shown = display_path(path)
    with open_trusted(path, what) as f:
        data = f.read()
    return parse_framed(data, shown, kind=kind, magic=magic, fmt=fmt, meta_cls=meta_cls, fix=fix, make=make,
                        contents=contents)  # fmt: skip


def parse_framed(data: bytes, shown: str, *, kind: str, magic: bytes, fmt: int, meta_cls: type[Meta], fix: str,
                 make: str, contents: str) -> tuple[Meta, bytes]:  # fmt: skip
    """`read_framed`'s checks on bytes already read (from a file, or from a fleet's Redis: `shown` names where)."""
    if not data.startswith(magic):
        raise DeployError(f"{shown} is not a fullgraph {kind} file (no {magic.strip().decode()} header); "
                          f"make one with {make}")  # fmt: skip
    header, newline, payload = data[len(magic) :].partition(b"\n")
    try:
        raw = json.loads(header) if newline else None
        if not isinstance(raw, dict):
            raise ValueError("no header object")
        if raw.get("format") != fmt:
            raise DeployError(f"{shown} has {kind} format {raw.get('format')!r}, this fullgraph reads {fmt}; {fix}")
        meta = meta_cls(**raw)
    except (ValueError, TypeError) as e:  # bad JSON, missing or unknown fields
        raise DeployError(f"{shown} has a damaged header ({e}); {fix}") from None
    size, sha = meta.payload_bytes, meta.payload_sha256  # type: ignore[attr-defined]
    if len(payload) != size or hashlib.sha256(payload).hexdigest() != sha:
        raise DeployError(f"{shown} is damaged or truncated: {len(payload)} bytes of {contents} where its header "
                          f"says {size}, or a checksum that does not match; {fix}")  # fmt: skip
    return meta, payload
