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
