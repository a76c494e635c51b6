"""Output tokens to text pieces, as they are committed.

A token boundary may fall inside a character (byte-level vocabularies) and a stop string may span several
tokens, so the whole output is decoded again each time and only text that can no longer change is let out:
not a trailing replacement character (an incomplete UTF-8 sequence), not a tail that could begin a stop
string. The pieces joined equal the final text (cut before the first stop string).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, decode: Callable[[list[int]], str | None], stop: Iterable[str] = ()):
        self.decode = decode
        self.stop = tuple(s for s in stop if s)
        self.tokens: list[int] = []
        self.text = ""  # let out so far
        self.stopped = False  # a stop string was met: the text ends before it

    def push(self, tokens: list[int]) -> str:
        """Take committed tokens; return the text that is now final (may be empty)."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        full = self.decode(self.tokens) or ""
        cut = self._first_stop(full)
        if cut is not None:
            self.stopped = True
            return self._let_out(full[:cut])
        return self._let_out(full[: len(full.rstrip(REPLACEMENT)) - self._stop_prefix(full)])

    def finish(self) -> str:
        """The rest, once the output has ended."""
        if self.stopped:
            return ""
        return self._let_out(self.decode(self.tokens) or "")

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest end of `text` that begins a stop string (held back until it is decided)."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _let_out(self, upto: str) -> str:
        # text already let out cannot be taken back: a decoding that rewrites it (rare) only adds its new end
        if len(upto) <= len(self.text) or not upto.startswith(self.text):
            return ""
        piece, self.text = upto[len(self.text) :], upto
        return piece
