"""Progress of a long command, one phase at a time: `say(msg)` ends the phase before and starts the next.

On a terminal, a live line shows the running phase with its elapsed time ticking (a max-autotune compile runs for
minutes, and a frozen-looking line invites Ctrl-C) and each finished phase is printed with its duration. Off a
terminal (CI logs, pipes), each phase is one plain line as it starts, `[  12.3s] msg`, seconds since the start.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

REFRESH_PER_SECOND = 4


def duration(seconds: float) -> str:
    """ "4.2s", "12.3s", "2m05s", "1h02m"."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class _Phases:
    """The running phase and when it began; finished phases are printed through `console`, above `live`."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.start = time.monotonic()
        self.msg: str | None = None
        self.began = self.start
        self.spinner = Spinner("dots", style="cyan")

    def plain(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {msg}", file=self.console.file, flush=True)

    def next(self, msg: str | None, failure: str = "") -> None:
        """End the running phase (`failure` says how, if it did not finish) and start `msg`, if not None.

        The live line is redrawn before the finished phase is printed: printing redraws it below, and it must
        not show the phase that just ended."""
        now = time.monotonic()
        done, took = self.msg, now - self.began
        self.msg, self.began = msg, now
        if self.live is not None:
            self.live.refresh()
        if done is not None:
            mark = Text("✗ ", style="bold red") if failure else Text("✓ ", style="green")
            self.console.print(
                mark + Text(done), Text(duration(took) + (f" ({failure})" if failure else ""), style="dim")
            )

    def live_line(self) -> Spinner | Text:
        if self.msg is None:
            return Text("")
        self.spinner.update(text=Text(self.msg) + Text(f"  {duration(time.monotonic() - self.began)}", style="dim"))
        return self.spinner


@contextmanager
def progress_reporter(console: Console | None = None) -> Iterator[Callable[[str], None]]:
    """Yields `say(msg)`. `console` defaults to stderr; whether it is a terminal picks the live or plain form.

    Leaving the block ends the last phase (marked failed or interrupted when the block raised) and removes the
    live line, so what the command prints next starts on a clean line. While the live line shows, writes to
    sys.stderr (warnings, logging), and to sys.stdout when it is a terminal too, are printed above it.
    """
    # Bound to the stream of now: code in the block that swaps sys.stderr to capture output gets none of ours.
    console = console or Console(file=sys.stderr)
    phases = _Phases(console)
    if not console.is_terminal:
        yield phases.plain
        return
    live = Live(
        console=console,
        get_renderable=phases.live_line,
        refresh_per_second=REFRESH_PER_SECOND,
        transient=True,
        redirect_stdout=sys.stdout.isatty(),  # a pipe or file gets what was printed to it, not our terminal
        redirect_stderr=True,
    )
    phases.live = live
    with live:
        try:
            yield phases.next
        except KeyboardInterrupt:
            phases.next(None, "interrupted")
            raise
        except BaseException:
            phases.next(None, "failed")
            raise
        phases.next(None)
