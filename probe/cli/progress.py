"""Progress of the long commands (``export``, ``merge``, ``collect``, ``ab``) on stderr.

Writers report to a :class:`probe.progress.Progress`; :class:`Display` is one, and draws
it with rich, one line, on stderr::

    from rich.console import Console
    from exporters.prometheus import write

    with Display(Console(stderr=True)) as bars:
        bars.section("prometheus textfile")
        write(Recording.open("run.probe.db"), "run.prom", progress=bars)

Whether a command draws it (:func:`display_for`): ``--progress`` always (the argument
wins over the rules that follow), ``--no-progress`` never; otherwise only when stderr is a
terminal and nothing asks for plain output (``--json``, ``-`` for a written file, ``CI``,
``NO_COLOR``, ``TERM=dumb``). It never writes to stdout or to the
files a command writes. Counts reach rich at most every ``interval_s`` (0.1 s) of the
injected clock, never once per step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

__all__ = ["Display", "add_flag", "display_for", "wanted"]


# -- whether to draw ------------------------------------------------------------------------


def add_flag(parser: argparse.ArgumentParser, shows: str) -> None:
    """``--progress`` / ``--no-progress`` on a command's parser (``args.progress``);
    ``shows`` says what the line shows for this command."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"progress on stderr ({shows}): on a terminal unless --json, - output, CI, "
        "NO_COLOR or TERM=dumb; --progress: always, --no-progress: never",
    )


def wanted(flag: bool | None, *, plain: bool, stream: IO[str], environ: Mapping[str, str]) -> bool:
    """Draw progress? ``flag`` (``--progress``/``--no-progress``) decides when given;
    otherwise: a terminal on ``stream``, and no ``plain`` output asked for by the command
    (``--json``, ``-``) or by the environment (``CI``, ``NO_COLOR``, ``TERM=dumb``)."""
    if flag is not None:
        return flag
    if plain:
        return False
    if environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    if environ.get("NO_COLOR", "") != "" or environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


def display_for(
    flag: bool | None,
    *,
    plain: bool = False,
    bar: bool = True,
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Display:
    """The :class:`Display` a command uses: drawing on ``stream`` (stderr) when
    :func:`wanted` says so, else one that draws nothing. ``flag``: the command's
    ``--progress``/``--no-progress`` (``args.progress``); ``plain``: the command writes data
    to stdout or prints JSON."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    if not wanted(flag, plain=plain, stream=stream, environ=environ):
        return Display(None)
    from probe.cli.terminal import SafeConsole

    return Display(SafeConsole(file=stream, force_terminal=True, soft_wrap=True), bar=bar)


# -- drawing ------------------------------------------------------------------------------


class Display:
    """One line of progress on ``console`` (None: draws nothing, costs a counter).

    A :class:`Progress` for the writers, plus what the commands need around them:
    :meth:`section` names the target the next stages belong to, :meth:`describe`
    replaces the current line's text (``ab``'s arm, ``collect``'s counts), :meth:`echo`
    prints a line above the display (or to stdout, the display lifted meanwhile).
    ``bar=False`` draws a status line (spinner, text, elapsed) instead of a bar.
    ``get_time`` and ``auto_refresh=False`` make it deterministic for tests: it is then
    redrawn each time counts are pushed, never from a thread.
    """

    def __init__(
        self,
        console: Console | None,
        *,
        bar: bool = True,
        get_time: Callable[[], float] = time.monotonic,
        auto_refresh: bool = True,
        interval_s: float = 0.1,
    ) -> None:
        self.console = console
        self._bar = bar
        self._clock = get_time
        self._auto = auto_refresh
        self._interval = interval_s
        self._rich: RichProgress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._text = ""
        self._done = 0
        self._pushed_at = -float("inf")

    @property
    def on(self) -> bool:
        """Whether it draws (a live display is up)."""
        return self._rich is not None

    def __enter__(self) -> Display:
        if self.console is not None:
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                *self._columns(),
                console=self.console,
                auto_refresh=self._auto,
                refresh_per_second=1 / self._interval,
                transient=True,
                # stdout is the commands' data: never captured; our own stderr lines go
                # through echo()
                redirect_stdout=False,
                redirect_stderr=False,
                get_time=self._clock,
            )
            self._rich.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._push(draw=True)
            self._rich.stop()
            self._rich = None

    def _columns(self) -> list[Any]:
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

        if not self._bar:
            return [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
        return [
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            _count_column(),
            TimeElapsedColumn(),
        ]

    def section(self, label: str) -> None:
        """Prefix the following stages with ``label`` (an exporter's name)."""
        self._label = label

    def stage(self, description: str, total: int | None = None, unit: str = "steps") -> None:
        """Replace the line with a new stage at 0 of ``total``."""
        rich = self._rich
        if rich is not None and self._task is not None:
            self._push(draw=True)  # the stage's last count is drawn before it goes
            rich.remove_task(self._task)
        self._done = 0
        if rich is None:
            return
        self._text = f"{self._label}: {description}" if self._label else description
        self._task = rich.add_task(self._text, total=total, unit=unit)
        self._push()

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._rich is not None and self._clock() - self._pushed_at >= self._interval:
            self._push()

    def describe(self, text: str) -> None:
        """New text for the current line (drawn with the next push, at most every
        ``interval_s``)."""
        self._text = text
        if self._rich is not None and self._clock() - self._pushed_at >= self._interval:
            self._push()

    def echo(self, text: str, *, stdout: bool = False) -> None:
        """``print(text)`` to stderr (above the display), or to stdout (the display lifted
        while it prints, so stdout gets exactly the line, nothing of the display)."""
        rich = self._rich
        self._push()  # the line reports what the display counted: show the count first
        if rich is None or stdout:
            if rich is not None:
                rich.stop()
            print(text, file=sys.stdout if stdout else sys.stderr, flush=True)
            if rich is not None:
                rich.start()
            return
        from rich.text import Text

        rich.console.print(Text.from_ansi(text), highlight=False)

    def _push(self, *, draw: bool = False) -> None:
        """Hand the count to rich; drawn now when ``draw`` or without a refresh thread."""
        rich = self._rich
        if rich is None or self._task is None:
            return
        self._pushed_at = self._clock()
        rich.update(self._task, completed=self._done, description=self._text)
        if draw or not self._auto:
            rich.refresh()


def _count_column() -> Any:
    """``1,024/1,305 steps``, or ``1,024 steps`` when the total is not known."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class Count(ProgressColumn):
        def render(self, task: Task) -> Text:
            unit = str(task.fields.get("unit", ""))
            done = f"{int(task.completed):,}"
            if task.total is not None:
                return Text(f"{done}/{int(task.total):,} {unit}".rstrip())
            return Text(f"{done} {unit}" if unit else "")

    return Count()
