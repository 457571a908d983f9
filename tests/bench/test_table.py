import random
import sys

import pytest

from fullgraph.bench.table import format_table


class _Tty:
    """A stand-in stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


@pytest.fixture
def not_a_tty(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_columns_align_and_numbers_right_align(not_a_tty):
    rows = [[f"case{'x' * random.randint(0, 9)}", random.uniform(0, 1000)] for _ in range(4)]
    lines = format_table(["case", "ms"], rows).splitlines()
    assert len(lines) == 6 and set(lines[1]) == {"─"}
    assert len({len(line) for line in lines}) == 1  # numbers are right-aligned, so every line ends at one column
    assert lines[0].startswith("case") and lines[2].startswith(rows[0][0] + " ")
    assert lines[2].endswith(f"{rows[0][1]:.4g}")


def test_missing_numbers_read_dash_and_stay_right_aligned(not_a_tty):
    rows = [["copy", 0.123456, "TB/s"], ["gemm", None, "TFLOP/s"], ["big", 123456.7, "-"]]
    lines = format_table(["case", "ms", "unit"], rows).splitlines()
    ms_end = lines[0].index("ms") + 2
    assert [line[ms_end - 6 : ms_end] for line in lines[2:]] == ["0.1235", "     -", "123457"]
    assert lines[3].rstrip().endswith("TFLOP/s")  # text columns stay left-aligned


def test_booleans_and_text_are_not_numbers(not_a_tty):
    lines = format_table(["flag", "n"], [[True, 1], [False, 22]]).splitlines()
    assert lines[2].startswith("True ") and lines[3].startswith("False")
    assert lines[2].endswith(" 1") and lines[3].endswith("22")


def test_plain_text_off_a_terminal_and_long_rows_unwrapped(not_a_tty):
    long = "fused_" * 30
    text = format_table(["kernel", "µs"], [[long, 1.5], ["[bold]not markup[/bold]", 2.0]])
    assert "\x1b" not in text
    assert long in text.splitlines()[2]  # one line, as wide as it needs
    assert "[bold]not markup[/bold]" in text  # cell text is taken literally


def test_styled_on_a_terminal_unless_no_color(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Tty())
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\x1b[" in format_table(["case", "ms"], [["a", 1.0]])
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b" not in format_table(["case", "ms"], [["a", 1.0]])
