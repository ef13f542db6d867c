"""The progress line on rank 0's stderr while a sweep runs (:class:`Progress`): updated
before each backend at each size, cleared before each line of the table is printed.
"""

from __future__ import annotations

from typing import TextIO


class Progress:
    """``[bench] all_reduce ucx 16M (12/24)`` on stderr: rewritten in place on a TTY, plain
    lines with --verbose otherwise, nothing else (logs and piped output stay clean)."""

    def __init__(self, stream: TextIO, *, enabled: bool, verbose: bool) -> None:
        self._stream = stream
        self._tty = enabled and _isatty(stream)
        self._lines = enabled and verbose and not self._tty
        self._width = 0

    def update(self, text: str) -> None:
        line = f"[bench] {text}"
        if self._tty:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = max(self._width, len(line))
            self._stream.flush()
        elif self._lines:
            self._stream.write(line + "\n")
            self._stream.flush()

    def clear(self) -> None:
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
