"""Graph breaks, recompiles and CUDA-graph skips, read from real Dynamo and Inductor runs.

Nothing here calls `torch._dynamo.reset()` (which `torch._dynamo.explain` does, before and after): the
model is compiled with a recording backend of our own, so its cache entries sit beside everyone else's and
no other compiled model loses its compiled code. Recompiles are read from Dynamo's record of guard failures,
CUDA-graph skips from Inductor's skip log, each captured around our own calls only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import linecache
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from fullgraph.compile.options import dynamo_config_name
from fullgraph.compile.stats import last_record, recompiles_since
from fullgraph.diagnose import fixes
from fullgraph.diagnose.inputs import Example
from fullgraph.diagnose.report import GraphBreak, Recompile

# Our fixes, by what the reason says. First match wins; the last entry is the fallback.
BREAK_FIXES = (
    (
        "generic_jump|Data-dependent branching",
        "a condition on a tensor's value: compute both branches and pick with torch.where(cond, a, b)",
    ),
    ("item()", "Tensor.item() leaves the graph: keep the value as a 0-d tensor and use it in tensor ops"),
    ("print", "print/logging in forward: remove it, or log outside the compiled call"),
    ("Dynamic shape operator", "output shape depends on data (mask indexing, nonzero): pad to a fixed size or mask"),
    ("numpy", "numpy in forward: use the torch equivalent so the op stays in the graph"),
    ("tolist", "tolist() leaves the graph: keep values as tensors"),
    ("", "see torch's hint; restructure this line so Dynamo can trace it, or move it out of forward"),
)

RECOMPILE_FIXES = (
    (r"size mismatch at index (\d+)", "declare the input's dim {0} dynamic before the first call"
     " (torch._dynamo.mark_dynamic(input, {0}, min=..., max=...)), or pad it to a few fixed sizes (buckets)"),
    ("dtype mismatch", "cast the inputs to one dtype before calling the compiled model"),
    ("stride mismatch", "pass contiguous inputs (x.contiguous()) so strides stay the same between calls"),
    ("device mismatch", "keep the inputs on one device"),
    ("rank mismatch", "an input's number of dims changed: give it one rank on every call (reshape or unsqueeze"
     " the same way each time)"),
    (r"size\[\d+\] ==", "the graph used a tensor size as a fixed number (a Python int taken from .shape, e.g. a"
     " clamp bound or slice end) and the size changed: keep it a tensor op (no int(), no .item()), declare the dim"
     " dynamic, or pad to a few fixed sizes"),
    (r"___check_type_id|TYPE_MATCH", "a value changed type between calls (an int one call, a tensor or float the"
     " next): give it one type"),
    (r"___check_obj_id|ID_MATCH", "the graph was specialized on one Python object (a"
     " function, module or closure) and this call passed another: create it once (in __init__) and reuse it, or"
     " keep per-call objects out of forward"),
    (r"___as_tensor|== \d+|EQUALS_MATCH|CONSTANT_MATCH", "a Python number or flag the graph depends on changed:"
     " pass it as a tensor (torch.tensor(v)), or fix it in __init__"),
    ("", "a Python value the graph depends on changed: pass it as a tensor, or fix it in __init__"),
)  # fmt: skip


def _first_match(table, text: str) -> str:
    for pattern, fix in table:
        m = re.search(pattern, text) if pattern else None
        if not pattern or m:
            return fix.format(*(m.groups() if m else ()))
    return ""


@functools.cache
def _registry() -> dict:
    """torch's graph-break registry (id -> type, explanation, hints), where this torch ships one."""
    path = os.path.join(os.path.dirname(torch._dynamo.__file__), "graph_break_registry.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# Reasons Dynamo states without a registry link, by their first word, and the registry type they are.
_REASON_TYPES = {"generic_jump": "Data-dependent branching"}
# The reason Dynamo gives when it restarts after an unsupported instruction; torch's registry has no id for it.
_STEP_UNSUPPORTED = ("step_unsupported", "Unsupported bytecode instruction (no registry id)")


def _registry_entry(reason: str) -> tuple[str, str, str]:
    """(gb id, gb type, hint) for a break reason: by the id in torch's link, else by the type's text.

    The registry splits one hint over several items (GB0036 puts its config flag in the second): they are joined
    back into one text."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    if first.startswith(_STEP_UNSUPPORTED[0]):
        return "", _STEP_UNSUPPORTED[1], ""
    m = re.search(r"/gb/gb(\d+)\.html", reason)
    reg = _registry()
    gb_type = _REASON_TYPES.get(first.split(" ", 1)[0], first)
    gb_id = f"GB{m.group(1)}" if m else next((k for k, v in reg.items() if v and v[0].get("Gb_type") == gb_type), "")
    entry = reg.get(gb_id, [{}])[0] if gb_id else {}
    hints = entry.get("Hints") or re.findall(r"Hint: (.*)", reason)
    hint = re.sub(r"\s+", " ", "".join(h if h.endswith(" ") else h + " " for h in hints)).strip()
    return gb_id, entry.get("Gb_type", gb_type if gb_id else ""), hint


def _ours(frames: Sequence[str], reason: str, fix: str) -> dict:
    """A break's fix and code: ours where one of our fixes removes it (diagnose.fixes), else `fix`."""
    names = fixes.for_break(frames, reason)
    if not names:
        return {"fix": fix}
    return {"fix": fixes.break_fix(names), "fixes": names, "code": fixes.code(names)}


def _break_from(reason_obj) -> GraphBreak:
    frame = reason_obj.user_stack[-1] if reason_obj.user_stack else None
    reason = reason_obj.reason or ""
    gb_id, gb_type, hint = _registry_entry(reason)
    frames = [f"{f.filename}:{f.name}" for f in reason_obj.user_stack or ()]
    return GraphBreak(
        file=frame.filename if frame else "",
        line=frame.lineno if frame else 0,
        function=frame.name if frame else "",
        source=(frame.line or "").strip() if frame else "",
        reason=reason.strip().splitlines()[0] if reason.strip() else "",
        gb_id=gb_id,
        gb_type=gb_type,
        hint=hint,
        **_ours(frames, reason, _first_match(BREAK_FIXES, reason)),
    )


@dataclass
class Recorder:
    """A torch.compile backend that records each graph Dynamo hands over, then runs it eagerly."""

    graphs: list = field(default_factory=list)
    breaks: list[GraphBreak] = field(default_factory=list)
    recording: bool = True  # off after the first run: recompiles for new inputs are not new graph breaks
    first_call_failures: list = field(default_factory=list)  # (code, guard failure) during the first call
    own: set[str] = field(default_factory=set)  # compile ids of this recorder's compiles (stats.recompiles_since)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        if not self.recording:
            return gm.forward
        self.graphs.append(gm)
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and reason.graph_break:
            self.breaks.append(_break_from(reason))
        return gm.forward

    @property
    def graph_break_count(self) -> int:
        # The count torch._dynamo.explain reports: graphs captured, less one.
        return max(len(self.graphs) - 1, 0)


@contextlib.contextmanager
def room_for_recompiles():
    """The doctor compiles one model several ways; raise Dynamo's per-function recompile limit meanwhile so
    later configurations are not silently run in eager mode. Scoped: restored on exit."""
    cfg = torch._dynamo.config
    name = dynamo_config_name("recompile_limit")
    with cfg.patch(**{name: max(getattr(cfg, name), 64)}):
        yield


# Dynamo's `graph_breaks` log (TORCH_LOGS="graph_breaks"): it also names breaks that leave no graph behind, such as
# one inside a loop, after which Dynamo skips the whole frame and runs it eagerly.
_BREAK_LOG = ("torch._dynamo.symbolic_convert.__graph_breaks",)
_LOGGED = re.compile(
    r"Graph break in user code at (?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*)", re.S
)
_SKIPPED = "Skipping the function and falling back to eager"
_SECOND = "*** While handling this graph break, another graph break occurred: ***"
# Why Dynamo gave up on a whole function, by the title of the break that made it give up.
_SKIP_WHY = {"graph break in loop": "a graph break inside a loop, where Dynamo cannot resume"}
_FRAME = re.compile(r"frame skipped: (\w+)")  # Dynamo's debug context names the function it skipped
_CALLER = re.compile(r", in (\w+)\n")  # else the innermost frame of the user code traceback
_TRACEBACK_FRAME = re.compile(r'File "(?P<file>[^"]+)", line \d+, in (?P<function>\w+)')


def _own_text(section: str) -> str:
    """A break's own title, explanation and hints: what its fix is matched on (never the debug context or the
    traceback, whose quoted code can name anything, `print` included)."""
    return section.split("Developer debug context:", 1)[0].split("User code traceback:", 1)[0].strip()


def _break_from_log(message: str) -> GraphBreak | None:
    """A break from Dynamo's log; for a skipped frame, the break that started it (the first one named), its fix
    matched on its own reason, and why the function was skipped."""
    m = _LOGGED.match(message)
    if not m:
        return None
    file, line, text = m["file"], int(m["line"]), m["reason"]
    skipped = _SKIPPED in text
    first, _, second = text.split("Graph break encountered:", 1)[-1].partition(_SECOND) if skipped else (text, "", "")
    frames = [f"{f['file']}:{f['function']}" for f in _TRACEBACK_FRAME.finditer(first)]  # the break's own stack
    first = _own_text(first)
    gb_id, gb_type, hint = _registry_entry(first)
    title = first.splitlines()[0].strip() if first else ""
    ours = _ours(frames, first, _first_match(BREAK_FIXES, first))
    why = ""
    if skipped:
        cause = _own_text(second).splitlines()[0].strip() if second.strip() else ""
        why = f"{_SKIP_WHY.get(cause, cause or 'Dynamo could not resume after a graph break')}: {title} at line {line}"
        if cause in _SKIP_WHY:
            ours["fix"] += (
                "; it breaks inside a loop, so Dynamo gives up on the whole function: move it out of the loop"
            )
    named = _FRAME.search(text) or next(reversed(list(_CALLER.finditer(text + "\n"))), None)
    function = named[1] if named else ""
    return GraphBreak(
        file=file, line=line, function=function, source=linecache.getline(file, line).strip(), reason=title,
        gb_id=gb_id, gb_type=gb_type, hint=hint, skipped=why, **ours,
    )  # fmt: skip


def capture_breaks(model: Callable, example: Example) -> tuple[Recorder, Callable]:
    """Compile `model` with a `Recorder` and run it once on `example`; returns the recorder and the compiled model.

    Breaks come from the graphs handed to the recorder and, for places that left no graph (a skipped frame), from
    Dynamo's graph-break log; guard failures during this first call (a decoding loop whose cache grows each
    step) are kept in `rec.first_call_failures` for `first_call_recompiles`."""
    rec = Recorder()
    compiled = torch.compile(model, backend=rec)
    before = last_record()
    with torch.no_grad(), quiet_dynamo(), _collecting(_BREAK_LOG, propagate=False) as logged:
        example.call(compiled)
    rec.recording = False
    rec.first_call_failures = _new_failures(before, rec.own)
    seen = {(os.path.abspath(b.file), b.line) for b in rec.breaks}
    for b in filter(None, map(_break_from_log, logged)):
        if (os.path.abspath(b.file), b.line) not in seen:
            seen.add((os.path.abspath(b.file), b.line))
            rec.breaks.append(b)
    return rec, compiled


def group_breaks(breaks: Sequence[GraphBreak]) -> list[GraphBreak]:
    """One entry per place and reason (a break inside a per-image loop is hit once per image), with its count."""
    groups: dict[tuple, GraphBreak] = {}
    for b in breaks:
        key = (b.file, b.line, b.reason)
        groups[key] = dataclasses.replace(groups[key], count=groups[key].count + 1) if key in groups else b
    return list(groups.values())


@contextlib.contextmanager
def quiet_dynamo():
    """Silence Dynamo's own warnings about the breaks we are recording (the report carries them). Scoped."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _new_failures(before: object | None, own: set[str] | None = None) -> list[tuple]:
    """(where, guard failure) of each recompile since `before`: one per recompile (compile.stats.recompiles_since,
    which with `own` leaves out the failures of cache entries another compile made), `where` carrying the recompiled
    frame's co_name, co_filename and co_firstlineno."""
    return [(m, m.recompile_reason) for m in recompiles_since(before, own)]


_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>\w+?)_at_(?P<line>\d+)$")


def user_function_name(code_name: str) -> str:
    """Dynamo names the code after a graph break `torch_dynamo_resume_in_forward_at_32`: say it as a user would."""
    m = _RESUME.match(code_name)
    return f"{m['fn']} (after the break at line {m['line']})" if m else code_name


def capture_recompiles(
    compiled: Callable, variants: Sequence[tuple[str, Example]], own: set[str] | None = None
) -> list[Recompile]:
    """Call `compiled` on each (trigger, inputs) in turn and report the guard failures each call caused, one entry
    per cause: a new batch size fails the guards of every fragment of a broken function once, which is one cause
    with one fix, counted, and named after the user's function rather than Dynamo's resume functions. `own`: the
    compile ids of `compiled`'s compiles so far (a `Recorder`'s), so that a function first reached on a new input
    and compiled before by another model is not counted as a recompile."""
    groups: dict[tuple[str, str], Recompile] = {}
    for trigger, example in variants:
        before = last_record()
        with torch.no_grad(), quiet_dynamo():
            example.call(compiled)
        _fold(groups, trigger, _new_failures(before, own))
    return list(groups.values())


def first_call_recompiles(rec: Recorder) -> list[Recompile]:
    """The recompiles inside the first call (trigger "first call"), one entry per cause. Nothing the user passed
    changed: one call ran a function more than once with other inputs, so the fix says that first (transformers'
    SegFormer on the CPU: the `wrapper` of its output-capturing decorator, compiled per calling module after a
    break, read "an input's number of dims changed: give it one rank on every call")."""
    groups: dict[tuple[str, str], Recompile] = {}
    _fold(groups, "first call", rec.first_call_failures)
    limit = getattr(torch._dynamo.config, dynamo_config_name("recompile_limit"))
    return [dataclasses.replace(r, fix=_within_one_call(r, limit)) for r in groups.values()]


def _within_one_call(r: Recompile, limit: int) -> str:
    return (
        "not your inputs: one call runs this function again with other arguments (a helper or a decorator's wrapper "
        "shared by several modules, compiled on its own after a break); each kind compiles once and later calls "
        f"reuse it. Nothing to fix while its compiles stay under torch's recompile limit ({limit}), past which it "
        f"runs eagerly; to share one graph: {r.fix}"
    )


def _fold(groups: dict[tuple[str, str], Recompile], trigger: str, failures: Sequence[tuple]) -> None:
    for code, reason in failures:
        failure = str(reason).strip()
        fix = _first_match(RECOMPILE_FIXES, failure)
        key = (trigger, fix)
        if key not in groups:
            groups[key] = Recompile(
                function=user_function_name(code.co_name), file=code.co_filename, line=code.co_firstlineno,
                trigger=trigger, guard_failure=failure, fix=fix,
            )  # fmt: skip
            continue
        old = groups[key]
        # Name the cause after the fragment the user wrote (the function's start), not a resumed one.
        better = "after the break" in old.function and not _RESUME.match(code.co_name)
        named = {"function": code.co_name, "line": code.co_firstlineno, "guard_failure": failure} if better else {}
        groups[key] = dataclasses.replace(old, count=old.count + 1, **named)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _collecting(names: Sequence[str], propagate: bool = True) -> Iterator[list[str]]:
    """Every message of the named loggers inside the block, at any level (torch's artifact loggers are off unless
    TORCH_LOGS asks for them: they are switched on here and back after). Scoped."""
    loggers = [logging.getLogger(n) for n in names]
    handler = _Collect()
    saved = [(lg.level, lg.disabled, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
        lg.disabled = False
        lg.propagate = propagate and lg.propagate
    try:
        yield handler.messages
    finally:
        for lg, (level, disabled, prop) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.disabled = disabled
            lg.propagate = prop


@contextlib.contextmanager
def cudagraph_skips():
    """Collect Inductor's CUDA-graph skip messages emitted inside the block (a list, filled on exit)."""
    from torch._dynamo.utils import counters

    names = ("torch._inductor.cudagraph_utils.__cudagraphs", "torch._inductor.cudagraph_utils")
    before = counters["inductor"]["cudagraph_skips"]
    found: list[str] = []
    try:
        with _collecting(names) as messages:
            yield found
    finally:
        found.extend(dict.fromkeys(m for m in messages if "skip" in m.lower()))
        skips = counters["inductor"]["cudagraph_skips"] - before
        if skips > len(found):
            found.append(f"{skips - len(found)} more skip(s) counted by Inductor without a logged reason")
