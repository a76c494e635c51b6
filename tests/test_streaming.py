"""TextStream: committed tokens to final text pieces. Tokens here are strings and decoding joins them, so a
"token" can end inside a multi-byte character (shown as U+FFFD until the next one completes it)."""

from multispec.streaming import TextStream

PIECES = {0: "Hel", 1: "lo", 2: " wor", 3: "ld", 4: ".", 5: " And", 6: " more"}


def decode(ids):
    text = "".join(PIECES.get(i, "") for i in ids)
    # token 9 is the first half of "é" and token 10 the second: alone, 9 decodes to the replacement character
    out = []
    for i in ids:
        if i == 9:
            out.append("\ufffd")
        elif i == 10 and out and out[-1] == "\ufffd":
            out[-1] = "é"
        else:
            out.append(PIECES.get(i, ""))
    return "".join(out) if any(i in (9, 10) for i in ids) else text


def run(stream, batches):
    pieces = [stream.push(b) for b in batches]
    return pieces, stream.finish()


def test_pieces_join_to_the_text():
    s = TextStream(decode)
    pieces, rest = run(s, [[0], [1, 2], [3], [4]])
    assert pieces == ["Hel", "lo wor", "ld", "."] and rest == "" and s.text == "Hello world."


def test_an_incomplete_character_is_held_back():
    s = TextStream(decode)
    pieces, rest = run(s, [[0], [9], [10], [1]])
    assert pieces == ["Hel", "", "é", "lo"] and s.text == "Helélo"


def test_a_stop_string_across_tokens_ends_the_text_before_it():
    s = TextStream(decode, stop=["o wo"])
    assert s.push([0]) == "Hel"
    assert s.push([1]) == "l"  # "Hello": the "o" may begin the stop string, so it is held back
    assert s.push([2]) == "" and s.stopped  # "Hello wor" holds "o wo": the text ends before it
    assert s.push([3]) == "" and s.finish() == "" and s.text == "Hell"


def test_a_held_back_tail_that_is_not_a_stop_is_let_out():
    s = TextStream(decode, stop=[" wx", "zzz"])
    assert s.push([0, 1]) == "Hello"
    assert s.push([2]) == " wor"  # " w" began " wx" but "or" followed
    assert s.push([5]) == " And" and s.finish() == ""
    assert not s.stopped and s.text == "Hello wor And"


def test_the_earliest_of_several_stops_wins():
    s = TextStream(decode, stop=["more", "wor"])
    pieces, _ = run(s, [[0, 1, 2, 3, 4, 5, 6]])
    assert pieces == ["Hello "] and s.stopped


def test_a_progress_note_during_streamed_text_starts_on_its_own_line(capsys):
    from multispec import console

    console.write("1")
    console.note("multispec: compiling ...")
    console.write(". Danube\n")
    console.note("multispec: loaded")
    console.write("2. Nile")
    console.end_text()
    console.note("multispec: done")
    out, err = capsys.readouterr()
    assert out == "1. Danube\n2. Nile"  # the text itself is untouched
    assert err == "\nmultispec: compiling ...\nmultispec: loaded\nmultispec: done\n"


def byte_decode(pieces):
    """A byte-level tokenizer's decode: token i is the bytes pieces[i]; an incomplete character at the end
    decodes to U+FFFD, as transformers' byte-level decoders give it."""
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_that_ends_in_an_incomplete_character_is_held_back_whole():
    # "xxa" then the two bytes of "é": while "é" is incomplete the text is "xxa\ufffd", whose "a" may begin the
    # stop string "aé"; letting it out leaked a part of the stop (the text came out "xxa", not "xx")
    s = TextStream(byte_decode([b"xxa", b"\xc3", b"\xa9", b"z"]), stop=["a\u00e9"])
    pieces = [s.push([0]), s.push([1]), s.push([2])]
    assert s.stopped and "".join(pieces) == "xx" and s.text == "xx"
    assert s.push([3]) == "" and s.finish() == ""


def test_text_goes_on_after_the_tokenizer_rewrites_what_was_sent():
    # a tokenizer that cleans up spaces before punctuation: "Hello" " " decodes "Hello ", then "." rewrites it to
    # "Hello.": what was sent stays sent, and the text after it still comes (it stalled for good before)
    words = ["Hello", " ", ".", " world", " again"]

    def decode(ids):
        return "".join(words[i] for i in ids).replace(" .", ".")

    s = TextStream(decode)
    pieces = [s.push([i]) for i in range(len(words))] + [s.finish()]
    assert pieces[:2] == ["Hello", " "]
    assert "".join(pieces) == s.text == "Hello . world again"


def test_without_a_rewrite_the_pieces_join_to_the_decoded_text_with_clean_up():
    words = ["Hello", ".", " world"]

    def decode(ids):
        return "".join(words[i] for i in ids).replace(" .", ".")

    s = TextStream(decode, stop=["zz"])
    pieces = [s.push([i]) for i in range(len(words))] + [s.finish()]
    assert "".join(pieces) == decode([0, 1, 2]) == "Hello. world"
