"""`bench --batch`: every method over the prompt set N sequences at a time, beside transformers' batched
`generate`, with its rows, table, plot, resume and refusals. Tiny random Llamas keep it fast."""

import json

import pytest

from multispec.entrypoints.cli import main
from multispec.tools.bench import load_prompts
from multispec.tools.bench.batched import BATCH_RESULTS, run_batched


def id_prompts(tmp_path, n=4):
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"prompt": [3 + i, 10, 20 + i + 2 * i * i]}) + "\n" for i in range(n)))
    return load_prompts([str(path)])


def run(pair, tmp_path, rows, methods=("ar", "sd:gamma=2", "hf"), **kw):
    kw = {"max_new_tokens": 5, "warmup": False, "progress": False, **kw}
    return run_batched(pair[0], pair[1], id_prompts(tmp_path), list(methods), tmp_path / "out", rows, **kw)


def test_every_method_at_every_row_count_beside_transformers(tmp_path, tiny_pair, capsys):
    written = run(tiny_pair, tmp_path, [1, 2])
    assert [(r["rows"], r["method"]) for r in written] == [
        (1, "ar"), (1, "sd:gamma=2"), (1, "hf"), (2, "ar"), (2, "sd:gamma=2"), (2, "hf"),
    ]  # fmt: skip
    for r in written:
        # four prompts, five new tokens each (the tiny models have no stop token), in every method
        assert r["error"] is None and r["new_tokens"] == 20 and r["tokens_per_second"] > 0
    by = {(r["rows"], r["method"]): r for r in written}
    for rows in (1, 2):
        ar, sd = by[(rows, "ar")], by[(rows, "sd:gamma=2")]
        assert ar["target_calls"] == 20  # one target call a token
        assert sd["target_calls"] < 20 and sd["tokens_per_target_call"] > 1
        assert by[(rows, "hf")]["target_calls"] is None  # transformers does not say
    table = (tmp_path / "out" / "batch.md").read_text()
    assert "| `sd:gamma=2` | 0 |" in table and "x ar" in table and "x hf" in table
    assert (tmp_path / "out" / "batch.png").stat().st_size > 0
    assert "2 rows" in capsys.readouterr().out


def test_resume_runs_only_what_is_missing_and_an_earlier_run_is_not_overwritten(tmp_path, tiny_pair):
    run(tiny_pair, tmp_path, [1], methods=("ar",))
    with pytest.raises(ValueError, match="batch.jsonl exists: pass --resume"):
        run(tiny_pair, tmp_path, [1], methods=("ar",))
    run(tiny_pair, tmp_path, [1, 2], methods=("ar",), resume=True)
    lines = (tmp_path / "out" / BATCH_RESULTS).read_text().splitlines()
    assert [json.loads(line)["rows"] for line in lines] == [1, 2]
    with pytest.raises(ValueError, match="made with other settings"):
        run(tiny_pair, tmp_path, [4], methods=("ar",), resume=True, max_new_tokens=6)


@pytest.mark.parametrize(
    "methods, rows, needle",
    [
        (("ar", "hf-assisted"), [2], "'hf-assisted' decodes one sequence at a time"),
        (("ar",), [0], "row counts of at least 1"),
        (("ar", "bogus"), [2], "unknown method 'bogus'"),
    ],
)
def test_bad_runs_are_refused_before_decoding(tmp_path, tiny_pair, methods, rows, needle):
    with pytest.raises(ValueError, match=needle):
        run(tiny_pair, tmp_path, rows, methods=methods)
    assert not (tmp_path / "out" / BATCH_RESULTS).exists()


def test_cli_batch_on_saved_tiny_models(tmp_path, tiny_pair, capsys):
    for name, model in zip(("target", "draft"), tiny_pair, strict=True):
        model.model.save_pretrained(tmp_path / name)
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"prompt": [3 + i, 10]}) + "\n" for i in range(3)))
    args = ["bench", "--prompts", str(path), "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
            "--method", "ar", "--method", "hf", "--max-new-tokens", "4", "--batch", "1,3", "--no-warmup",
            "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "3 rows" in printed and "wrote" in printed
    assert len((tmp_path / "out" / BATCH_RESULTS).read_text().splitlines()) == 4
    assert main([*args[:-2], "--batch", "two", "--out", str(tmp_path / "other")]) == 2
    assert "--batch takes row counts such as 8 or 1,2,4,8, got 'two'" in capsys.readouterr().err
