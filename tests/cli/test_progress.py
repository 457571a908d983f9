import io
import re
import time

import pytest
from rich.console import Console

from fullgraph.cli.progress import REFRESH_PER_SECOND, duration, progress_reporter

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100, color_system="standard" if terminal else None), buf


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.04, "0.0s"), (12.34, "12.3s"), (59.96, "60.0s"), (125.9, "2m05s"), (3725, "1h02m")]
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_off_a_terminal_each_phase_is_a_plain_line_with_seconds_since_the_start():
    console, buf = _console(terminal=False)
    with progress_reporter(console) as say:
        say("loading m.py:Net on cpu")
        time.sleep(0.25)
        say("compile default [fp32]: compiling")  # brackets are not markup
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in buf.getvalue()
    m = [re.fullmatch(r"\[ *(\d+\.\d)s\] (.*)", line) for line in lines]
    assert all(m), lines
    assert [x[2] for x in m] == ["loading m.py:Net on cpu", "compile default [fp32]: compiling"]
    assert float(m[0][1]) < 0.2 <= float(m[1][1]) < 5
    assert lines[0].startswith("[   0.0s] ")  # the width today's logs have: "[   0.0s] msg"


def test_default_console_is_stderr_when_not_a_terminal(capsys):
    with progress_reporter() as say:
        say("phase one")
    out, err = capsys.readouterr()
    assert out == "" and re.fullmatch(r"\[ +\d+\.\ds\] phase one\n", err)


def test_on_a_terminal_the_live_line_ticks_and_finished_phases_print_their_duration():
    console, buf = _console(terminal=True)
    with progress_reporter(console) as say:
        say("compile max-autotune bf16: compiling")
        time.sleep(3.5 / REFRESH_PER_SECOND)
        say("compile max-autotune bf16: timing")
        time.sleep(0.1)
    text = ANSI.sub("", buf.getvalue())
    ticks = set(re.findall(r"compile max-autotune bf16: compiling  (\d+\.\d)s", text))
    assert len(ticks) >= 2, text  # the running phase's elapsed time was redrawn as it grew
    done = re.findall(r"✓ (compile max-autotune bf16: \w+) (\d+\.\d)s", text)
    assert [d[0] for d in done] == ["compile max-autotune bf16: compiling", "compile max-autotune bf16: timing"]
    assert float(done[0][1]) >= 0.8 and float(done[1][1]) < 0.8


def test_a_failing_block_marks_its_phase_and_raises():
    console, buf = _console(terminal=True)
    with pytest.raises(RuntimeError, match="boom"), progress_reporter(console) as say:
        say("graph breaks: compiling")
        raise RuntimeError("boom")
    text = ANSI.sub("", buf.getvalue())
    assert re.search(r"✗ graph breaks: compiling \d+\.\ds \(failed\)", text), text
    assert "✓" not in text


def test_an_interrupt_is_not_called_a_failure():
    console, buf = _console(terminal=True)
    with pytest.raises(KeyboardInterrupt), progress_reporter(console) as say:
        say("timing")
        raise KeyboardInterrupt
    assert re.search(r"✗ timing \d+\.\ds \(interrupted\)", ANSI.sub("", buf.getvalue()))
