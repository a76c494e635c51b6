"""Where generated text and progress notes meet on a terminal: text streams to stdout as it is accepted, notes
(a compile, a load, a calibration) go to stderr. A note that arrives while the text's line is open starts on
a line of its own instead of being glued to the text."""

from __future__ import annotations

import sys

_open_line = False  # stdout holds a streamed line that has not ended


def write(text: str) -> None:
    """Stream generated text to stdout."""
    global _open_line
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
        _open_line = not text.endswith("\n")


def end_text() -> None:
    """The streamed text is over (its last line may stay open: the caller ends it)."""
    global _open_line
    _open_line = False


def note(message: str) -> None:
    """One progress line on stderr."""
    print(("\n" if _open_line else "") + message, file=sys.stderr, flush=True)
