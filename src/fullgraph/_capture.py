"""Hold what libraries print while our timed or traced calls run, and say it back in one line per kind.

Dynamo, Inductor and transformers warn through `warnings` and `logging`, and a model may `print` in its forward;
dozens of such lines between a command's progress lines bury them. Inside `capture_output()` they are counted
instead, grouped by kind (warning category and source, logger and level, stream), and `summary()` gives one line
per group: `warnings: 12 × UserWarning from torch._dynamo: <first message>`.

Everything is restored on exit, exceptions included. Captures nest: the innermost one holds what is emitted
inside it, and on exit adds its counts to the one around it, so an outer capture sees its whole block.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fullgraph._paths import display_path, module_name

LOGGERS = ("torch._dynamo", "torch._inductor", "transformers")
MESSAGE_CHARS = 120
# torch's CPU wheels warn once per process, while `import torch` runs, when numpy is not installed; numpy is
# optional to torch and to fullgraph.
NUMPY_MISSING = r"Failed to initialize NumPy"


@dataclass(frozen=True)
class Kind:
    """One group of captured output: a warning category from one source, a logger's records of one level, or
    the lines written to one stream."""

    channel: str  # "warnings", "logs", "stdout" or "stderr"
    label: str  # "UserWarning", "WARNING"; "" for streams
    source: str  # "torch._dynamo", "transformers", a file; "" for streams
    count: int
    first: str  # the first message (its first line, truncated)

    def line(self) -> str:
        if self.channel in ("stdout", "stderr"):
            return f"{self.channel}: {self.count} line{'s' * (self.count != 1)} printed from Python: {self.first}"
        return f"{self.channel}: {self.count} × {self.label} from {self.source}: {self.first}"


class Captured:
    """What one `capture_output` block caught so far; read it inside the block or after."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str, str], list] = {}  # (channel, label, source) -> [count, first]

    def add(self, channel: str, label: str, source: str, message: str, count: int = 1) -> None:
        group = self._groups.get((channel, label, source))
        if group is None:
            self._groups[(channel, label, source)] = [count, _one_line(message)]
        else:
            group[0] += count

    def kinds(self) -> list[Kind]:
        """The groups in the order each was first seen."""
        return [Kind(ch, label, src, n, first) for (ch, label, src), (n, first) in self._groups.items()]

    def summary(self) -> list[str]:
        """One line per group (empty when nothing was caught)."""
        return [k.line() for k in self.kinds()]

    def __len__(self) -> int:
        return sum(n for n, _ in self._groups.values())


_current: contextvars.ContextVar[Captured | None] = contextvars.ContextVar("fullgraph_capture", default=None)


@contextlib.contextmanager
def capture_output(
    *,
    stdout: bool = False,
    stderr: bool | None = None,
    loggers: Sequence[str] = LOGGERS,
    level: int = logging.WARNING,
) -> Iterator[Captured]:
    """Within the block, count instead of show: every `warnings.warn`, records of `level` and above from
    `loggers` (and their children), and with `stdout` / `stderr` the lines Python code writes to sys.stdout /
    sys.stderr (`stderr` follows `stdout` unless given). Yields a `Captured`; `summary()` gives its lines.

    Warnings are counted at every occurrence (the filters' once-per-location actions count each repeat) but
    filters that ignore a category or turn it into an error keep doing so. Log records below `level` pass
    through to the handlers they would have reached. Writes from C code (compilers, the CUDA driver) go to the
    file descriptors directly and are not captured.
    """
    cap = Captured()
    token = _current.set(cap)
    with contextlib.ExitStack() as stack:
        stack.callback(_hand_up, cap, token)
        stack.enter_context(_warnings_into(cap))
        for name in loggers:
            stack.enter_context(_logger_into(cap, logging.getLogger(name), level))
        if stdout:
            stack.enter_context(_stream_into(cap, "stdout"))
        if stdout if stderr is None else stderr:
            stack.enter_context(_stream_into(cap, "stderr"))
        yield cap


@contextlib.contextmanager
def quiet_missing_numpy() -> Iterator[None]:
    """Within the block, drop torch's "Failed to initialize NumPy" warning: a base install has no numpy, torch
    says so once per process while it is first imported, and nothing fullgraph does needs numpy."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NUMPY_MISSING, category=UserWarning)
        yield


def _hand_up(cap: Captured, token: contextvars.Token) -> None:
    """Leave the block: the capture around this one (if any) becomes current again and gets our counts."""
    _current.reset(token)
    outer = _current.get()
    if outer is not None:
        for k in cap.kinds():
            outer.add(k.channel, k.label, k.source, k.first, k.count)


def _one_line(message: str) -> str:
    lines = [s.strip() for s in str(message).strip().splitlines()]
    text = lines[0] if lines else ""
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


@functools.lru_cache(maxsize=512)  # a flood repeats a few files thousands of times
def _source(filename: str) -> str:
    """Where a warning came from, as a package: torch's subsystem ("torch._dynamo"), another library's top-level
    package ("transformers"), or the file itself when it is not an importable module."""
    name = module_name(filename)
    if name is None:
        return display_path(filename)
    parts = name.split(".")
    return ".".join(parts[:2] if parts[0] == "torch" else parts[:1])


# Filter actions that show a warning once per location, module or process: within a capture, every repeat is
# counted instead. "ignore" and "error" stay as the user set them.
_ONCE_ACTIONS = ("default", "module", "once")


@contextlib.contextmanager
def _warnings_into(cap: Captured) -> Iterator[None]:
    def record(message, category, filename, lineno, file=None, line=None):
        cap.add("warnings", category.__name__, _source(filename), str(message))

    saved_default = warnings.defaultaction
    with warnings.catch_warnings():
        # simplefilter bumps the filters' version, so per-module registries of warnings already shown are
        # ignored and repeats reach `record`; the rewrite keeps the user's filters otherwise as they were.
        filters = list(warnings.filters)
        warnings.simplefilter("always")
        warnings.filters[:] = [("always" if f[0] in _ONCE_ACTIONS else f[0], *f[1:]) for f in filters]
        warnings.defaultaction = "always"
        warnings.showwarning = record
        try:
            yield
        finally:
            warnings.defaultaction = saved_default


class _Tap(logging.Handler):
    """Stands in for a logger's handlers: counts records of `level` and above, passes the others on to the
    handlers that were there (and up the hierarchy when the logger propagated)."""

    def __init__(self, cap: Captured, logger: logging.Logger, level: int, handlers: list, propagate: bool):
        super().__init__(logging.NOTSET)
        self.cap, self.logger, self.min_level = cap, logger, level
        self.handlers, self.propagate = handlers, propagate

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= self.min_level:
            try:
                message = record.getMessage()
            except Exception:  # a bad format string in the library's call: keep its raw message
                message = str(record.msg)
            self.cap.add("logs", record.levelname, self.logger.name, message)
            return
        for h in self.handlers:
            if record.levelno >= h.level:
                h.handle(record)
        if self.propagate and self.logger.parent is not None:
            self.logger.parent.callHandlers(record)


@contextlib.contextmanager
def _logger_into(cap: Captured, logger: logging.Logger, level: int) -> Iterator[None]:
    saved, propagate = list(logger.handlers), logger.propagate
    tap = _Tap(cap, logger, level, saved, propagate)
    logger.handlers = [tap]
    logger.propagate = False
    try:
        yield
    finally:
        added = [h for h in logger.handlers if h is not tap and h not in saved]
        logger.handlers = saved + added
        # A library that configured its logger inside the block (transformers adds its handler on import)
        # keeps its handler; such libraries also turn propagation off, so it stays as they left it.
        if not added:
            logger.propagate = propagate


class _Lines(io.TextIOBase):
    """A text stream that counts each line written to it in `cap` under `channel`."""

    def __init__(self, cap: Captured, channel: str, encoding: str):
        super().__init__()
        self.cap, self.channel, self._encoding, self._partial = cap, channel, encoding, ""

    @property
    def encoding(self) -> str:
        return self._encoding

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        *lines, self._partial = (self._partial + s).split("\n")
        for line in lines:
            self._add(line)
        return len(s)

    def flush_partial(self) -> None:
        self._add(self._partial)
        self._partial = ""

    def _add(self, line: str) -> None:
        text = line.rsplit("\r", 1)[-1].strip()  # a progress bar redraws with \r: its last state counts
        if text:
            self.cap.add(self.channel, "", "", text)


@contextlib.contextmanager
def _stream_into(cap: Captured, channel: str) -> Iterator[None]:
    saved = getattr(sys, channel)
    stream = _Lines(cap, channel, getattr(saved, "encoding", None) or "utf-8")
    setattr(sys, channel, stream)
    try:
        yield
    finally:
        setattr(sys, channel, saved)
        stream.flush_partial()


# Kineto (torch.profiler's C++ half) prints a line on profiler start and stop straight to file descriptor 2,
# beneath Python's sys.stderr, on every profile; torch offers no switch for it (KINETO_LOG_LEVEL is not read for
# these). They carry nothing for a user.
KINETO_NOISE = ("SyncActivityProfilerHandler", "ActivityProfilerController", "CuptiActivityProfiler")


@contextlib.contextmanager
def quiet_profiler_lines() -> Iterator[None]:
    """Drop Kineto's start/stop lines written to file descriptor 2 inside the block; every other line written
    there (a real error from C++) is passed on when the block ends."""
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (an embedded interpreter): nothing to hold
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError, OSError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines() if not _kineto(ln)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def _kineto(line: str) -> bool:
    return any(k in line for k in KINETO_NOISE) or not line.strip()
