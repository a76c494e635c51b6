"""Output tokens to text pieces, as they are committed.

A token boundary may fall inside a character (byte-level vocabularies) and a stop string may span several
tokens, so the output is decoded again each time and only text that can no longer change is let out: not a
trailing replacement character (an incomplete UTF-8 sequence), not a tail that could begin a stop string.
The pieces joined equal the final text (cut before the first stop string), except where a later token makes
the tokenizer rewrite text already let out (one that cleans up spaces before punctuation: "Hello", " " then
"." decodes "Hello."): what was sent stays sent, and the text goes on from the tokens after it, decoded on
their own (a new segment), so nothing after a rewrite is lost.
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
        # the current segment: its first token and the text before it; and the tokens whose text has been let
        # out in whole, with that text (a rewrite starts the next segment after them)
        self._start, self._before = 0, ""
        self._settled, self._settled_text = 0, ""

    def push(self, tokens: list[int]) -> str:
        """Take committed tokens; return the text that is now final (may be empty)."""
        if self.stopped:
            return ""
        self.tokens.extend(tokens)
        full = self._full()
        cut = self._first_stop(full)
        if cut is not None:
            self.stopped = True
            return self._let_out(full[:cut], full)
        # a trailing incomplete character is not final, nor a stop string's possible beginning before it
        stable = full.rstrip(REPLACEMENT)
        return self._let_out(stable[: len(stable) - self._stop_prefix(stable)], full)

    def finish(self) -> str:
        """The rest, once the output has ended."""
        if self.stopped:
            return ""
        full = self._full()
        return self._let_out(full, full)

    def _full(self) -> str:
        """The whole text as it now stands: what came before the segment and the segment decoded; a new segment
        where the decoding rewrote text already let out."""
        full = self._before + (self.decode(self.tokens[self._start :]) or "")
        if not full.startswith(self.text) and self._start != self._settled:
            self._start, self._before = self._settled, self._settled_text
            full = self._before + (self.decode(self.tokens[self._start :]) or "")
        return full

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

    def _let_out(self, upto: str, full: str) -> str:
        """Let `upto` (of the text as it stands, `full`) out: the part past what was let out already (by
        length: after a rewrite that no new segment could undo, the text goes on rather than stalls)."""
        if len(upto) <= len(self.text):
            return ""
        piece = upto[len(self.text) :]
        self.text += piece
        if upto == full:  # every token so far is spent: a later rewrite starts after them
            self._settled, self._settled_text = len(self.tokens), self.text
        return piece
