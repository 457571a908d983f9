"""One model's compile artifacts in the form tlparse reads, written to a folder of its own.

torch's structured trace (what `TORCH_TRACE=folder` turns on) goes through one process-wide logger,
`torch.__trace`, set up once at import. There is no per-compile switch, so a `TraceScope` adds its own file handler
to that logger around this model's calls only and takes it off after: compiles of other models outside those calls
do not reach the folder, but anything another thread compiles during them does (the logger is process-wide), and a
`TORCH_TRACE` set for the process still receives everything too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Iterator

import torch

from fullgraph.errors import UsageError


def _trace_parts():
    try:
        from torch._logging._internal import LazyTraceHandler, TorchLogsFormatter, trace_log
    except ImportError as e:  # private API: present from torch 2.2 through 2.14
        raise UsageError(
            f"debug= needs torch's structured trace logging, which torch {torch.__version__} does not have here "
            f"({e}); set TORCH_TRACE=<folder> for the whole process instead"
        ) from None
    return LazyTraceHandler, TorchLogsFormatter, trace_log


class TraceScope:
    """A trace file in `folder` (created on the first compile), attached to torch's trace logger inside `active()`."""

    def __init__(self, folder: str | os.PathLike) -> None:
        handler_cls, formatter_cls, self._log = _trace_parts()
        self.folder = os.path.abspath(os.fspath(folder))
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise UsageError(f"debug={os.fspath(folder)!r} is a file; give a folder for the compile trace")
        self._handler = handler_cls(self.folder)
        self._handler.setFormatter(formatter_cls(trace=True))
        self._strings_written = 0
        weakref.finalize(self, self._handler.close)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        self._log.addHandler(self._handler)
        try:
            self._write_strings()
            yield
        finally:
            self._log.removeHandler(self._handler)
            from torch._logging.structured import INTERN_TABLE

            self._strings_written = len(INTERN_TABLE)  # those interned while attached were written by torch

    def _write_strings(self) -> None:
        """tlparse resolves file names through a string table that torch writes once per process, when a string is
        first seen: strings interned before this file was attached (by earlier compiles) are copied into it."""
        from torch._logging.structured import INTERN_TABLE

        if len(INTERN_TABLE) <= self._strings_written:
            return
        for s, i in list(INTERN_TABLE.items())[self._strings_written :]:
            record = self._log.makeRecord(
                self._log.name, logging.DEBUG, __file__, 0, "", (), None, extra={"metadata": {"str": [s, i]},
                                                                                   "payload": None}
            )  # fmt: skip
            self._handler.handle(record)
        self._strings_written = len(INTERN_TABLE)

    def files(self) -> list[str]:
        if not os.path.isdir(self.folder):
            return []
        return sorted(os.path.join(self.folder, f) for f in os.listdir(self.folder) if f.endswith(".log"))
