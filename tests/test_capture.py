import logging
import os
import sys
import warnings

import pytest
import torch

from fullgraph import _capture
from fullgraph._capture import MESSAGE_CHARS, capture_output, quiet_missing_numpy


class Seen(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def lib_logger():
    """A library logger with its own handler that does not propagate, as transformers and torch set theirs."""
    logger = logging.getLogger("fgtest_lib")
    seen = Seen()
    logger.handlers, logger.propagate, logger.level = [seen], False, logging.DEBUG
    yield logger, seen
    logger.handlers, logger.propagate, logger.level = [], True, logging.NOTSET


def _state():
    return (
        sys.stdout,
        sys.stderr,
        warnings.showwarning,
        list(warnings.filters),
        warnings.defaultaction,
        {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate) for n in ("torch._dynamo", "x")},
    )


def test_repeated_warnings_are_one_line_with_their_count(recwarn):
    warnings.simplefilter("default")  # shown once per location outside a capture
    with capture_output() as cap:
        for i in range(12):
            warnings.warn(f"graph break {i}\nsecond line", UserWarning, stacklevel=1)
        warnings.warn("x" * 500, RuntimeWarning, stacklevel=1)
    assert cap.summary()[0] == "warnings: 12 × UserWarning from tests: graph break 0"
    kinds = cap.kinds()
    assert [(k.label, k.count) for k in kinds] == [("UserWarning", 12), ("RuntimeWarning", 1)]
    assert len(kinds[1].first) == MESSAGE_CHARS and kinds[1].first.endswith("…")
    assert len(cap) == 13
    assert not recwarn.list  # nothing reached the warnings machinery outside


def test_warning_source_is_the_library_package():
    with capture_output() as cap:
        warnings.warn_explicit("deprecated", FutureWarning, torch._dynamo.__file__, 10)
    assert cap.summary() == ["warnings: 1 × FutureWarning from torch._dynamo: deprecated"]


def test_filters_that_ignore_or_raise_keep_doing_so():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("error", category=ResourceWarning)
        with capture_output() as cap:
            warnings.warn("old", DeprecationWarning, stacklevel=1)
            with pytest.raises(ResourceWarning):
                warnings.warn("leak", ResourceWarning, stacklevel=1)
    assert cap.summary() == []


def test_library_logs_are_counted_and_lower_levels_pass_through(lib_logger):
    logger, seen = lib_logger
    child = logging.getLogger("fgtest_lib.models.bert")
    handlers = list(logger.handlers)  # ours, and pytest's: it attaches its own to loggers that do not propagate
    with capture_output(loggers=("fgtest_lib",)) as cap:
        for _ in range(3):
            child.warning("tokenizer %s is slow", "bert")
        child.error("bad config")
        child.info("loading weights")
    assert cap.summary() == [
        "logs: 3 × WARNING from fgtest_lib: tokenizer bert is slow",
        "logs: 1 × ERROR from fgtest_lib: bad config",
    ]
    assert seen.messages == ["loading weights"]  # below WARNING: shown as without the capture
    assert logger.handlers == handlers and logger.propagate is False


def test_a_real_dynamo_warning_is_summarized(capfd):
    def f(x):
        return x * 2

    with capture_output() as cap, torch._dynamo.config.patch(recompile_limit=1):
        g = torch.compile(f, backend="eager", dynamic=False)
        for n in range(2, 5):
            g(torch.randn(n))
    torch._dynamo.reset()
    lines = [line for line in cap.summary() if line.startswith("logs:")]
    assert len(lines) == 1 and "WARNING from torch._dynamo: torch._dynamo hit config.recompile_limit" in lines[0]
    assert "recompile_limit" not in capfd.readouterr().err


def test_prints_are_captured_only_when_asked(capsys):
    with capture_output() as cap:
        print("not captured")
    with capture_output(stdout=True) as cap:
        print("from forward", 1)
        print("from forward", 2)
        print("to stderr", file=sys.stderr)
        sys.stdout.write("no newline at the end")
    assert capsys.readouterr().out == "not captured\n"
    assert cap.summary() == [
        "stdout: 3 lines printed from Python: from forward 1",
        "stderr: 1 line printed from Python: to stderr",
    ]
    with capture_output(stdout=True, stderr=False) as cap:
        print("kept on stderr", file=sys.stderr)
    assert capsys.readouterr().err == "kept on stderr\n" and cap.summary() == []


def test_nested_captures_hand_their_counts_outward(lib_logger):
    before = _state()
    with capture_output(stdout=True, loggers=("fgtest_lib",)) as outer:
        warnings.warn("outer", UserWarning, stacklevel=1)
        with capture_output(stdout=True, loggers=("fgtest_lib",)) as inner:
            warnings.warn("inner", UserWarning, stacklevel=1)
            logging.getLogger("fgtest_lib").warning("log inside")
            print("printed inside")
        assert inner.summary() == [
            "warnings: 1 × UserWarning from tests: inner",
            "logs: 1 × WARNING from fgtest_lib: log inside",
            "stdout: 1 line printed from Python: printed inside",
        ]
        print("printed outside")
    assert outer.summary() == [
        "warnings: 2 × UserWarning from tests: outer",
        "logs: 1 × WARNING from fgtest_lib: log inside",
        "stdout: 2 lines printed from Python: printed inside",
    ]
    assert lib_logger[1].messages == []
    assert _state() == before


def test_everything_is_restored_when_the_block_raises():
    before = _state()
    with pytest.raises(KeyError), capture_output(stdout=True, loggers=("torch._dynamo", "x")):
        print("lost")
        raise KeyError("boom")
    assert _state() == before


def test_a_logger_configured_inside_the_block_keeps_its_handler():
    logger = logging.getLogger("fgtest_late")
    late = Seen()
    try:
        with capture_output(loggers=("fgtest_late",)):
            logger.addHandler(late)  # what transformers does when it is first imported
            logger.propagate = False
        assert late in logger.handlers and logger.propagate is False
    finally:
        logger.handlers, logger.propagate = [], True


def test_quiet_missing_numpy_drops_only_that_warning():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_missing_numpy():
            warnings.warn("Failed to initialize NumPy: No module named 'numpy'", UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]


def test_kineto_lines_on_descriptor_2_are_dropped_and_others_kept(capfd):
    with _capture.quiet_profiler_lines():
        os.write(2, b"USDT:2026 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real error from C++\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "a real error from C++" in err
