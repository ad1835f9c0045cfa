"""What reaches a terminal: text from a recording, a profile or a control reply, with its
control characters shown escaped.

A model name or a command line stored in a recording (or answered by a process on a
control socket) is text someone else wrote. Printed raw, an escape sequence in it moves
the cursor, retitles the window, hides lines or, on some terminals, writes the
clipboard. Every rich console of the command line is a :class:`SafeConsole`, which
escapes the text of every segment it renders (its own styling is added afterwards and
stays); plain lines (``probe ps``, error lines) go through :func:`sanitize`.

    >>> sanitize("DeepSeek\\x1b]0;pwned\\x07")
    'DeepSeek\\\\x1b]0;pwned\\\\x07'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment

__all__ = ["SafeConsole", "console", "sanitize"]

# C0 controls but tab and newline, DEL, C1 controls, and the lone surrogates a file name
# that is not UTF-8 decodes to (shown as the byte it stands for)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # surrogateescape: the undecodable byte
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def sanitize(text: str) -> str:
    """``text`` with every control character but tab and newline written as ``\\xNN``."""
    return _UNSAFE.sub(_escape, text)


class SafeConsole(Console):
    """A rich ``Console`` whose rendered text never carries a control character of its
    data: each text segment is :func:`sanitize`-d; rich's own control segments (cursor
    moves of a live view) and styles pass."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(sanitize(seg.text), seg.style, seg.control)
            for seg in buffer
        )

    def on_broken_pipe(self) -> None:
        # rich's own answer is exit status 1 and no word; the command line's is the
        # status of a reader that left early (:func:`probe.cli.main`)
        self.quiet = True
        raise BrokenPipeError


def console(**kwargs: Any) -> SafeConsole:
    """A :class:`SafeConsole` (the arguments of ``rich.console.Console``)."""
    return SafeConsole(**kwargs)
