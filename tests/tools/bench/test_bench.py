"""The evaluation harness: prompt formats, the run loop (append, resume, errors), metrics, energy meters,
the report, and the command line. Tiny random Llamas keep it fast; one test runs the real default pair."""

import json
import math
import struct
import subprocess
import sys
import time

import pytest
import torch

from multispec import MarkovLM
from multispec.decoding import METHODS, Method, ar
from multispec.entrypoints.cli import main
from multispec.tools.bench import (
    Meter,
    NVMLMeter,
    RAPLMeter,
    default_methods,
    load_prompts,
    metrics,
    pick_meter,
    read_results,
    run_bench,
)
from multispec.tools.bench.memory import PeakMemory
from tests.conftest import tiny_llama


def id_prompts(tmp_path, n=4, name="ids.jsonl"):
    path = tmp_path / name
    path.write_text(
        "".join(json.dumps({"prompt": [3 + i, 10, 20 + i], "category": ["a", "b"][i % 2]}) + "\n" for i in range(n))
    )
    return path


def bench(pair, prompts, out, methods=("ar", "sd:gamma=3"), **kw):
    kw = {"max_new_tokens": 6, "progress": False, "meter": None, "warmup": False, **kw}
    return run_bench(pair[0], pair[1], prompts, list(methods), out, **kw)


# -- prompt sets ---------------------------------------------------------------------------------


def test_three_prompt_formats_in_file_order(tmp_path):
    spec = tmp_path / "mt.jsonl"
    spec.write_text(
        json.dumps({"question_id": 81, "category": "writing", "turns": ["Write.", "Rewrite."]})
        + "\n\n"
        + json.dumps(
            {
                "question_id": 101,
                "category": "reasoning",
                "turns": ["Who?", "Why?"],
                "reference": ["Second place.", "Uncertain."],
            }
        )
        + "\n"
    )
    wmt = tmp_path / "wmt.json"
    wmt.write_text(json.dumps(["Translate: a\nOutput: ", "Translate: b\nOutput: "]))
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        json.dumps({"prompt": "2+2?", "reference": "4", "id": "q1"}) + "\n" + json.dumps({"prompt": [1, 2, 3]}) + "\n"
    )
    ps = load_prompts([spec, wmt, plain])
    assert [p.id for p in ps] == ["mt:81", "mt:101", "wmt:0", "wmt:1", "plain:q1", "plain:1"]
    assert [p.category for p in ps] == ["writing", "reasoning", "wmt", "wmt", "plain", "plain"]
    assert ps[0].text == "Write." and ps[1].text == "Who?"  # first turn only
    assert [p.reference for p in ps] == [None, "Second place.", None, None, "4", None]
    assert ps[5].text == [1, 2, 3]


def test_categories_filter_then_limit_per_file(tmp_path):
    rows = [{"question_id": i, "category": "xyz"[i % 3], "turns": [f"q{i}"]} for i in range(9)]
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in rows))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(["w0", "w1", "w2"]))
    assert [p.id for p in load_prompts([a], categories=["y"])] == ["a:1", "a:4", "a:7"]
    assert [p.id for p in load_prompts([a], categories=["y", "z"], limit=3)] == ["a:1", "a:2", "a:4"]
    assert [p.id for p in load_prompts([a, b], limit=2)] == ["a:0", "a:1", "b:0", "b:1"]
    with pytest.raises(ValueError, match="unknown category 'w'.*x, y, z"):
        load_prompts([a], categories=["w"])
    with pytest.raises(ValueError, match="occurs twice"):
        load_prompts([a, a])
    with pytest.raises(ValueError, match="limit must be an integer >= 1, got 0"):
        load_prompts([a], limit=0)


def test_spread_takes_categories_in_turn(tmp_path):
    # categories in blocks, as in MT-Bench: a plain limit would take only the first category
    rows = [{"question_id": i, "category": "xyz"[i // 3], "turns": [f"q{i}"]} for i in range(9)]
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in rows))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(["w0", "w1", "w2"]))
    assert [p.id for p in load_prompts([a], limit=4)] == ["a:0", "a:1", "a:2", "a:3"]
    assert [p.id for p in load_prompts([a], limit=4, spread=True)] == ["a:0", "a:3", "a:6", "a:1"]
    assert [p.id for p in load_prompts([a, b], limit=2, spread=True)] == ["a:0", "a:3", "b:0", "b:1"]
    assert [p.id for p in load_prompts([a], categories=["z", "y"], spread=True)] == [
        "a:3",
        "a:6",
        "a:4",
        "a:7",
        "a:5",
        "a:8",
    ]


@pytest.mark.parametrize(
    "content, needle",
    [
        ('{"turns": ["ok"]}\n{"turns": ["cut"', "line 2 is not valid JSON"),
        ('{"question": "no prompt field"}\n', "line 1 has neither 'turns'"),
        ('{"prompt": ""}\n', "'prompt' must be a non-empty string"),
        ('{"turns": []}\n', "'turns' must be a list"),
        ('["fine", 3]', "list of non-empty strings"),
        ('["unclosed", ', "not valid JSON"),
        ("   \n", "is empty"),
    ],
)
def test_malformed_prompt_files(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        load_prompts([path])


def test_spec_bench_rag_rows_with_several_acceptable_answers(tmp_path):
    # Spec-Bench's RAG rows give, per turn, a list of acceptable answers; the first is the reference
    path = tmp_path / "rag.jsonl"
    path.write_text(
        json.dumps(
            {"question_id": 1, "category": "rag", "turns": ["Who?"], "reference": [["Pakistan", "the Pakistani state"]]}
        )
        + "\n"
        + json.dumps({"turns": ["Bad?"], "reference": [[1, 2]]})
        + "\n"
    )
    with pytest.raises(ValueError, match="line 2: 'reference' must be a string"):
        load_prompts([path])
    path.write_text(path.read_text().splitlines()[0] + "\n")
    assert [p.reference for p in load_prompts([path])] == ["Pakistan"]


def test_missing_prompt_file(tmp_path):
    with pytest.raises(ValueError, match="nope.jsonl does not exist"):
        load_prompts([tmp_path / "nope.jsonl"])


# -- metrics -------------------------------------------------------------------------------------


def test_perplexity_is_the_unwarped_target_likelihood_by_hand():
    table = [[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]
    target = MarkovLM(table)
    lp = metrics.mean_logprob(target, [0], [1, 1, 2])
    expected = (math.log(0.25) + math.log(0.8) + math.log(0.1)) / 3
    assert lp == pytest.approx(expected, abs=1e-12)
    assert metrics.perplexity([lp]) == pytest.approx((0.25 * 0.8 * 0.1) ** (-1 / 3))
    # MTAD's aggregate: exp of minus the mean of per-output means, not token-weighted
    assert metrics.perplexity([math.log(0.5), math.log(0.125)]) == pytest.approx(4.0)
    assert metrics.mean_logprob(target, [0], []) is None and metrics.perplexity([None]) is None


def test_perplexity_on_a_tiny_llama_matches_prefix_by_prefix_scoring():
    model = tiny_llama(seed=3)
    prompt, output = [5, 9, 2], [7, 7, 30, 1]
    ref = []
    for i, tok in enumerate(output):  # no cache, one prefix at a time: a different code path
        logits = model.model(torch.tensor([prompt + output[:i]])).logits[0, -1].double()
        ref.append(torch.log_softmax(logits, -1)[tok].item())
    assert metrics.mean_logprob(model, prompt, output) == pytest.approx(sum(ref) / len(ref), abs=1e-5)


def test_text_metrics_on_known_strings():
    # LCS("the cat sat on the mat", "the cat on the mat") = 5 words: P = 5/6, R = 1, F = 10/11
    assert metrics.rouge_l("the cat sat on the mat", "the cat on the mat") == pytest.approx(10 / 11)
    assert metrics.rouge_l("dogs bark", "the cat on the mat") == 0.0
    assert metrics.bleu("Das Haus ist klein.", "Das Haus ist klein.") == pytest.approx(100.0)
    assert metrics.bleu("völlig anders hier", "Das Haus ist klein.") < 10
    assert metrics.corpus_bleu(["a b c d e"], ["a b c d e"]) == pytest.approx(100.0)
    assert metrics.exact_match("The answer: Washington, DC.", "answer washington dc") == 1.0
    assert metrics.exact_match("Washington", "Washington, DC") == 0.0
    s = metrics.spread([4.0, 1.0, None, 3.0, 2.0])
    assert s == {"median": 2.5, "q1": 1.75, "q3": 3.25, "n": 4}


# -- energy --------------------------------------------------------------------------------------


def fake_powercap(root, packages):
    for i, (energy, span) in enumerate(packages):
        zone = root / f"intel-rapl:{i}"
        zone.mkdir(parents=True)
        (zone / "energy_uj").write_text(f"{energy}\n")
        (zone / "max_energy_range_uj").write_text(f"{span}\n")
        sub = root / f"intel-rapl:{i}:0"  # a core sub-zone: part of the package, must not be added again
        sub.mkdir()
        (sub / "energy_uj").write_text("999999\n")
        (sub / "max_energy_range_uj").write_text(f"{span}\n")


def test_rapl_reads_packages_and_survives_wraparound(tmp_path):
    fake_powercap(tmp_path, [(900_000, 1_000_000), (5_000_000, 262_143_328_850)])
    meter = pick_meter("cpu", rapl_root=tmp_path)
    assert isinstance(meter, RAPLMeter) and len(meter.zones) == 2 and "2 packages" in meter.name
    before = meter.read()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("100000\n")  # wrapped: 900000 -> 1e6 -> 100000
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("7500000\n")
    assert meter.joules(before, meter.read()) == pytest.approx(0.2 + 2.5)


def test_no_readable_meter_means_unavailable(tmp_path):
    assert pick_meter("cpu", rapl_root=tmp_path / "no-powercap") is None
    try:
        NVMLMeter()
        nvml = True
    except Exception:
        nvml = False
    found = pick_meter("cuda", rapl_root=tmp_path / "no-powercap")
    assert (found is not None) == nvml and (found is None or isinstance(found, NVMLMeter))


class SteppingMeter(Meter):
    """A stand-in for hardware this machine lacks: the counter advances 1.5 J per reading."""

    name = "test counter"

    def __init__(self):
        self.value = 0.0

    def read(self):
        self.value += 1.5
        return [self.value]

    def joules(self, before, after):
        return after[0] - before[0]


def test_energy_per_token_or_unavailable_in_the_report(tmp_path, tiny_pair):
    prompts = load_prompts([id_prompts(tmp_path, 2)])
    summary = bench(tiny_pair, prompts, tmp_path / "e", methods=["ar"], meter=SteppingMeter())
    rows = read_results(tmp_path / "e" / "results.jsonl")
    assert all(r["energy_j"] == pytest.approx(1.5) and r["j_per_token"] == pytest.approx(1.5 / 6) for r in rows)
    assert summary["temperatures"]["0.0"]["methods"]["ar"]["j_per_token"] == pytest.approx(0.25)
    assert "energy: test counter" in (tmp_path / "e" / "report.md").read_text()
    bench(tiny_pair, prompts, tmp_path / "n", methods=["ar"], meter=None)
    md = (tmp_path / "n" / "report.md").read_text()
    assert "energy: **unavailable**" in md and "| unavailable |" in md
    assert all(r["energy_j"] is None for r in read_results(tmp_path / "n" / "results.jsonl"))


def test_peak_memory_sees_a_tensor_held_during_the_run_and_not_one_freed_before():
    torch.zeros(64 * 2**20 // 4)  # allocated and freed before: must not count
    with PeakMemory("cpu") as idle:
        time.sleep(0.02)
    with PeakMemory("cpu") as held:
        block = torch.ones(96 * 2**20 // 4)  # 96 MiB, touched, held for several readings
        time.sleep(0.05)
        del block
    assert idle.bytes < 16 * 2**20
    assert 90 * 2**20 <= held.bytes < 160 * 2**20


# -- the run loop --------------------------------------------------------------------------------


def test_rows_report_and_plots(tmp_path, tiny_pair):
    prompts = load_prompts([id_prompts(tmp_path, 4)])
    out = tmp_path / "out"
    summary = bench(tiny_pair, prompts, out, methods=["sd:gamma=3", "hf", "hf-assisted"], temperatures=[0, 1])
    rows = read_results(out / "results.jsonl")
    assert len(rows) == 2 * 4 * 4  # temperatures x prompts x (ar added as baseline + 3)
    assert [r["method"] for r in rows[:4]] == ["ar", "sd:gamma=3", "hf", "hf-assisted"]
    assert not any(r["error"] for r in rows)
    greedy = {(r["prompt_id"], r["method"]): r for r in rows if r["temperature"] == 0}
    for p in prompts:
        ar_row = greedy[(p.id, "ar")]
        assert ar_row["target_calls"] == ar_row["new_tokens"] == 6
        for m in ("sd:gamma=3", "hf", "hf-assisted"):  # greedy: every implementation gives ar's tokens
            assert greedy[(p.id, m)]["token_ids"] == ar_row["token_ids"], m
            assert greedy[(p.id, m)]["mean_logprob"] == pytest.approx(ar_row["mean_logprob"], abs=1e-5)
        assert greedy[(p.id, "hf")]["target_calls"] == 6  # counted by the forward hook
    t0 = summary["temperatures"]["0.0"]
    assert t0["methods"]["ar"]["speedup"]["median"] == 1.0
    assert t0["methods"]["sd:gamma=3"]["acceptance_rate"] is not None
    assert t0["methods"]["hf"]["acceptance_rate"] is None
    assert set(t0["categories"]) == {"a", "b"}
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["temperatures"]["1.0"]["methods"]["hf-assisted"]["prompts"] == 4
    md = (out / "report.md").read_text()
    assert "## Temperature 0 (greedy)" in md and "## Temperature 1" in md and "prefill included" in md
    assert "load average" in md and "peak MB" in md
    assert all(r["peak_memory_mb"] is not None and r["peak_memory_mb"] >= 0 for r in rows)
    assert "| sd:gamma=3 | 4 / 0 |" in md and "Fastest" in md
    for png in ("speedup.png", "quality_speed.png"):
        head = (out / png).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24])[0] > 300


def test_target_calls_are_the_forwards_the_target_ran(tmp_path, tiny_pair):
    # counted independently of the engine's counters: a hook on the transformers model itself
    # (the row methods too: beam and dsbd feed and commit several cache rows per call)
    forwards = {"target": 0, "draft": 0}
    hooks = [
        m.model.register_forward_pre_hook(lambda *_, k=k: forwards.__setitem__(k, forwards[k] + 1))
        for k, m in zip(forwards, tiny_pair, strict=True)
    ]
    try:
        bench(
            tiny_pair,
            load_prompts([id_prompts(tmp_path, 3)]),
            tmp_path / "out",
            methods=["sd:gamma=3", "beam:width=3", "dsbd"],
            temperatures=[0, 1],
        )
    finally:
        for hook in hooks:
            hook.remove()
    rows = read_results(tmp_path / "out" / "results.jsonl")
    assert len(rows) == 21 and not any(r["error"] for r in rows)  # dsbd only samples: no temperature-0 rows
    assert all(r["new_tokens"] == 6 for r in rows if r["method"] in ("ar", "sd:gamma=3"))
    # besides the generations, one scoring forward per row (the output's perplexity)
    assert forwards["target"] == sum(r["target_calls"] for r in rows) + len(rows)
    assert forwards["draft"] == sum(r["draft_calls"] for r in rows) > 0
    assert any(r["target_calls"] < 6 for r in rows if r["method"] == "sd:gamma=3")  # drafts were accepted


@pytest.mark.slow
def test_hf_static_compiles_in_the_warmup_not_in_timed_rows(tmp_path, tiny_pair, monkeypatch):
    # transformers sizes its static cache per call unless given max_cache_len, and a compiled prefill
    # specialises on the first prompt's length: either recompiles the forward inside a timed row
    from torch._dynamo.utils import counters

    from multispec.tools.bench import runner

    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps({"prompt": list(range(3, 3 + n))}) + "\n" for n in (3, 9, 5, 14)))
    graphs = []
    measure = runner._measure

    def counted(spec, *a, **k):
        before = counters["stats"]["unique_graphs"]
        row = measure(spec, *a, **k)
        if spec.name == "hf-static":
            graphs.append(counters["stats"]["unique_graphs"] - before)
        return row

    monkeypatch.setattr(runner, "_measure", counted)
    torch._dynamo.reset()
    counters.clear()
    bench(tiny_pair, load_prompts([path]), tmp_path / "out", methods=["hf-static"], warmup=True)
    rows = read_results(tmp_path / "out" / "results.jsonl")
    assert not any(r["error"] for r in rows) and len(graphs) == 4
    assert counters["stats"]["unique_graphs"] >= 2  # prefill and step were compiled (in the warm-up)
    assert graphs == [0, 0, 0, 0]
    # the cache is sized for the run's longest prompt and new tokens, once
    assert tiny_pair[0].model._previous_max_cache_length == 14 + 6
    torch._dynamo.reset()


def test_same_seed_same_rows(tmp_path, tiny_pair):
    prompts = load_prompts([id_prompts(tmp_path, 2)])
    for name in ("x", "y"):
        bench(tiny_pair, prompts, tmp_path / name, methods=["sd:gamma=2", "hf"], temperatures=[1.0], seed=7)
    x, y = (read_results(tmp_path / n / "results.jsonl") for n in ("x", "y"))
    assert [r["token_ids"] for r in x] == [r["token_ids"] for r in y]


def test_results_are_appended_per_prompt_and_resume_skips_finished_rows(tmp_path, tiny_pair, monkeypatch):
    calls = {"n": 0, "stop_at": 3}

    def interrupted(session, **_):  # a registry method that is stopped by the user on its third prompt
        calls["n"] += 1
        if calls["n"] == calls["stop_at"]:
            raise KeyboardInterrupt
        ar.decode(session)

    monkeypatch.setitem(METHODS, "flaky", Method("flaky", interrupted, needs_draft=False, exact="", summary=""))
    prompts = load_prompts([id_prompts(tmp_path, 4)])
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        bench(tiny_pair, prompts, out, methods=["flaky"])
    rows = read_results(out / "results.jsonl")
    assert [(r["prompt_id"], r["method"]) for r in rows] == [
        ("ids:0", "ar"),
        ("ids:0", "flaky"),
        ("ids:1", "ar"),
        ("ids:1", "flaky"),
        ("ids:2", "ar"),
    ]
    with pytest.raises(ValueError, match="exists: pass --resume"):
        bench(tiny_pair, prompts, out, methods=["flaky"])
    calls["stop_at"] = None
    bench(tiny_pair, prompts, out, methods=["flaky"], resume=True)
    after = read_results(out / "results.jsonl")
    assert after[:5] == rows  # finished rows were neither rerun nor rewritten
    keys = [(r["prompt_id"], r["method"]) for r in after]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert calls["n"] == 3 + 2  # the interrupted call, then only prompts 2 and 3
    # more prompts later: only the new ones run
    bench(tiny_pair, load_prompts([id_prompts(tmp_path, 6)]), out, methods=["flaky"], resume=True)
    assert len(read_results(out / "results.jsonl")) == 12 and calls["n"] == 7
    with pytest.raises(ValueError, match="max_new_tokens"):
        bench(tiny_pair, prompts, out, methods=["flaky"], resume=True, max_new_tokens=5)


def test_a_cut_last_line_is_dropped_on_resume(tmp_path, tiny_pair):
    prompts = load_prompts([id_prompts(tmp_path, 2)])
    out = tmp_path / "out"
    bench(tiny_pair, prompts, out, methods=["ar"])
    path = out / "results.jsonl"
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:40])  # killed while writing a row
    bench(tiny_pair, load_prompts([id_prompts(tmp_path, 3)]), out, methods=["ar"], resume=True)
    assert [r["prompt_id"] for r in read_results(path)] == ["ids:0", "ids:1", "ids:2"]


def test_a_method_that_fails_on_one_prompt_is_an_error_row_and_the_run_goes_on(tmp_path, tiny_pair, monkeypatch):
    def fragile(session, **_):
        if session.tokens[0] == 4:  # the second prompt
            raise RuntimeError("cannot handle this prompt")
        ar.decode(session)

    monkeypatch.setitem(METHODS, "fragile", Method("fragile", fragile, needs_draft=False, exact="", summary=""))
    assert "fragile" in default_methods()  # registered methods appear in the harness without changes to it
    prompts = load_prompts([id_prompts(tmp_path, 3)])
    summary = bench(tiny_pair, prompts, tmp_path / "out", methods=["fragile"])
    rows = read_results(tmp_path / "out" / "results.jsonl")
    assert len(rows) == 6
    bad = [r for r in rows if r["error"]]
    assert [(r["prompt_id"], r["method"]) for r in bad] == [("ids:1", "fragile")]
    assert bad[0]["error"] == "RuntimeError: cannot handle this prompt" and bad[0]["new_tokens"] is None
    s = summary["temperatures"]["0.0"]["methods"]["fragile"]
    assert s["prompts"] == 2 and s["errors"] == 1
    assert "fragile: 1 failed — RuntimeError: cannot handle this prompt" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize(
    "methods, kw, needle",
    [
        (["nope"], {}, "unknown method 'nope'; known methods: .*hf-assisted"),
        (["sd:gamma=x"], {}, "gamma must be an integer or 'auto', got 'x'"),
        (["sd:depth=2"], {}, "has no parameter 'depth'"),
        (["sd:gamma"], {}, "KEY=VALUE"),
        (["hf:gamma=2"], {}, "takes no parameters"),
        (["ar", "ar"], {}, "listed twice"),
        (["ar"], {"temperatures": [-1]}, "temperature must be a finite number >= 0"),
        (["ar"], {"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ],
)
def test_library_rejects_bad_runs(tmp_path, tiny_pair, methods, kw, needle):
    prompts = load_prompts([id_prompts(tmp_path, 1)])
    with pytest.raises(ValueError, match=needle):
        bench(tiny_pair, prompts, tmp_path / "out", methods=methods, **kw)
    assert not (tmp_path / "out").exists()  # nothing was run or written


def test_library_rejects_an_output_folder_that_is_a_file_and_a_missing_draft(tmp_path, tiny_pair):
    prompts = load_prompts([id_prompts(tmp_path, 1)])
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        bench(tiny_pair, prompts, tmp_path / "file", methods=["ar"])
    with pytest.raises(ValueError, match="'hf-assisted' needs a draft"):
        bench((tiny_pair[0], None), prompts, tmp_path / "o", methods=["hf-assisted"])


# -- command line --------------------------------------------------------------------------------


def cli_error(capsys, *args):
    code = main(["bench", *map(str, args)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("multispec: error: "), err
    return err


def test_cli_bad_input_gives_one_line_and_status_2(tmp_path, capsys):
    good = id_prompts(tmp_path, 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\nnot json\n')
    (tmp_path / "file").write_text("x")
    out = tmp_path / "out"
    assert "missing.jsonl does not exist" in cli_error(capsys, "--prompts", tmp_path / "missing.jsonl", "--out", out)
    assert "line 2 is not valid JSON" in cli_error(capsys, "--prompts", bad, "--out", out)
    assert "unknown method 'magic'" in cli_error(capsys, "--prompts", good, "--method", "magic", "--out", out)
    assert "gamma must be an integer or 'auto', got '2.5'" in cli_error(
        capsys, "--prompts", good, "--method", "sd:gamma=2.5", "--out", out
    )
    assert "is a file, not a folder" in cli_error(capsys, "--prompts", good, "--out", tmp_path / "file")
    assert "unknown preset 'huge'" in cli_error(capsys, "--preset", "huge", "--out", out)
    assert "unknown category 'z'" in cli_error(capsys, "--prompts", good, "--categories", "z", "--out", out)
    assert not out.exists()


def test_cli_end_to_end_on_saved_tiny_models(tmp_path, tiny_pair, capsys):
    for name, model in zip(("target", "draft"), tiny_pair, strict=True):
        model.model.save_pretrained(tmp_path / name)
    prompts = id_prompts(tmp_path, 2)
    args = [
        "bench",
        "--prompts",
        str(prompts),
        "--target",
        str(tmp_path / "target"),
        "--draft",
        str(tmp_path / "draft"),
        "--method",
        "sd:gamma=2",
        "--method",
        "hf",
        "--max-new-tokens",
        "5",
        "--out",
        str(tmp_path / "out"),
        "--limit",
        "1",
        "--no-warmup",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "sd:gamma=2" in printed and "tokens/s" in printed and "report.md" in printed
    assert len(read_results(tmp_path / "out" / "results.jsonl")) == 3
    assert main(args[:-3] + ["--limit", "2", "--resume"]) == 0  # one more prompt, three more rows
    assert len(read_results(tmp_path / "out" / "results.jsonl")) == 6


# -- the real default pair -----------------------------------------------------------------------


@pytest.mark.slow
def test_default_pair_one_prompt(tmp_path, default_pair):
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps(
            {"prompt": "What is the capital of France? Answer in one word.", "reference": "Paris", "category": "qa"}
        )
        + "\n"
    )
    summary = run_bench(
        default_pair.target,
        default_pair.draft,
        load_prompts([path]),
        ["ar", "sd:gamma=4", "hf", "hf-assisted"],
        tmp_path / "out",
        max_new_tokens=8,
        progress=False,
        warmup=False,
        models=default_pair.description,
    )
    rows = {r["method"]: r for r in read_results(tmp_path / "out" / "results.jsonl")}
    assert not any(r["error"] for r in rows.values())
    ar_row = rows["ar"]
    assert ar_row["text"].strip() and 1 <= ar_row["new_tokens"] <= 8
    for m in ("sd:gamma=4", "hf", "hf-assisted"):  # greedy: the same tokens from every implementation
        assert rows[m]["token_ids"] == ar_row["token_ids"], m
    assert 1 < ar_row["perplexity"] < 100
    assert 0 <= ar_row["rouge_l"] <= 1 and ar_row["bleu"] is not None and ar_row["exact_match"] in (0.0, 1.0)
    assert summary["temperatures"]["0.0"]["methods"]["sd:gamma=4"]["block_efficiency"]["median"] > 1
    assert "SmolLM2" in (tmp_path / "out" / "report.md").read_text()


# -- the llama-cpp peer ------------------------------------------------------------------------------


def test_llama_cpp_peer_is_opt_in_and_named_in_errors(tmp_path, tiny_pair, monkeypatch):
    from multispec.tools.bench import llamacpp
    from multispec.tools.bench.runner import parse_method_spec

    assert "llama-cpp" not in default_methods(True)  # an optional package: never a default
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    with pytest.raises(ValueError, match="needs the package llama-cpp-python, which is not installed: pip install"):
        parse_method_spec("llama-cpp")
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    assert parse_method_spec("llama-cpp").name == "llama-cpp"
    with pytest.raises(ValueError, match="takes no parameters"):
        parse_method_spec("llama-cpp:threads=2")
    with pytest.raises(ValueError, match="nope.gguf: no such file"):
        llamacpp.gguf_for(tiny_pair[0], tmp_path / "nope.gguf")
    # a target that is not the default pair's has no known GGUF: the run is refused before anything is written
    prompts = load_prompts([id_prompts(tmp_path, 1)])
    with pytest.raises(ValueError, match="needs a GGUF file of the target .*--gguf FILE"):
        bench(tiny_pair, prompts, tmp_path / "out", methods=["ar", "llama-cpp"])
    assert not (tmp_path / "out").exists()


def test_cli_names_a_missing_gguf_file(tmp_path, capsys):
    err = cli_error(
        capsys, "--prompts", id_prompts(tmp_path, 1), "--gguf", tmp_path / "missing.gguf", "--out", tmp_path / "out"
    )
    assert "missing.gguf: no such file" in err


@pytest.mark.slow
def test_llama_cpp_peer_on_the_shipped_gguf(tmp_path, default_pair):
    pytest.importorskip("llama_cpp", reason="the llama-cpp peer is optional (llama-cpp-python builds llama.cpp)")
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps(
            {"prompt": "What is the capital of France? Answer in one word.", "reference": "Paris", "category": "qa"}
        )
        + "\n"
    )
    run_bench(
        default_pair.target,
        None,
        load_prompts([path]),
        ["ar", "llama-cpp"],
        tmp_path / "out",
        max_new_tokens=12,
        temperatures=[0, 1],
        progress=False,
        warmup=False,
    )
    rows = read_results(tmp_path / "out" / "results.jsonl")
    peer = {r["temperature"]: r for r in rows if r["method"] == "llama-cpp"}
    assert not any(r["error"] for r in rows), [r["error"] for r in rows]
    for r in peer.values():
        assert 1 <= r["new_tokens"] <= 12 and r["text"].strip() and r["tokens_per_second"] > 0
        # one evaluation for the prompt and one per later token: no drafting
        assert r["target_calls"] == r["new_tokens"] and r["draft_calls"] == 0
        assert r["stopped"] == ("eos" if r["token_ids"][-1] in default_pair.target.stop_tokens else "length")
    assert "Paris" in peer[0.0]["text"]  # the same weights as the target (4-bit), greedy: the answer the target gives
    assert 1 < peer[0.0]["perplexity"] < 100  # scored under our target: the GGUF is the target's own
    from multispec.tools.bench.llamacpp import LlamaCppPeer, gguf_for
    from multispec.warp import Sampling

    peer_model = LlamaCppPeer(gguf_for(default_pair.target), torch.get_num_threads(), default_pair.target)
    ids = default_pair.target.encode("Tell me a story.", chat=True)
    draws = [peer_model.generate(ids, 10, Sampling(1.0), seed, frozenset())[0] for seed in (3, 3, 4)]
    assert draws[0] == draws[1] and draws[0] != draws[2]  # the seed decides the draw, and only the seed


# -- sweeps over processes ------------------------------------------------------------------------

DETERMINED = (
    "text",
    "token_ids",
    "new_tokens",
    "target_calls",
    "draft_calls",
    "block_efficiency",
    "acceptance_rate",
    "stopped",
    "seed",
    "prompt_tokens",
    "error",
    "accepted_length_histogram",
)


@pytest.mark.slow
def test_two_process_sweep_merges_to_the_rows_of_one_process_and_resumes(tmp_path, tiny_pair):
    """`bench --processes 2` (accelerate launch, two CPU processes) against one process, on saved tiny models;
    then a sweep whose second process died after one row is resumed: no finished row is run again."""
    for name, model in zip(("target", "draft"), tiny_pair, strict=True):
        model.model.save_pretrained(tmp_path / name)
    prompts = id_prompts(tmp_path, 5)
    common = [
        "bench",
        "--prompts",
        str(prompts),
        "--target",
        str(tmp_path / "target"),
        "--draft",
        str(tmp_path / "draft"),
        "--method",
        "sd:gamma=2",
        "--method",
        "mcsd:k_config=2x1",
        "--temperature",
        "0",
        "--temperature",
        "1",
        "--max-new-tokens",
        "6",
        "--no-warmup",
    ]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    one = read_results(tmp_path / "one" / "results.jsonl")
    proc = subprocess.run(
        [sys.executable, "-m", "multispec", *common, "--out", str(tmp_path / "two"), "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = read_results(tmp_path / "two" / "results.jsonl")
    assert len(one) == len(two) == 5 * 3 * 2  # prompts x (ar, sd, mcsd) x temperatures
    key = ("prompt_id", "method", "temperature")
    assert [[r[k] for k in key] for r in two] == [[r[k] for k in key] for r in one]  # one process's order
    for a, b in zip(one, two, strict=True):
        assert {k: a[k] for k in DETERMINED} == {k: b[k] for k in DETERMINED}
        assert a["mean_logprob"] == pytest.approx(b["mean_logprob"], rel=1e-5, abs=1e-6)
    assert not (tmp_path / "two" / "shards").exists()
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["meta"]["processes"] == 2
    assert "spread over 2 processes sharing the CPU" in (tmp_path / "two" / "report.md").read_text()

    # a sweep that died: process 0 finished its rows, process 1 wrote one and was killed inside the next
    died = tmp_path / "died"
    (died / "shards").mkdir(parents=True)
    mine = {0: [], 1: []}
    ids = [r["prompt_id"] for r in one]
    order = list(dict.fromkeys(ids))
    for r in two:
        mine[order.index(r["prompt_id"]) % 2].append(r)
    (died / "shards" / "results.0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine[0]))
    (died / "shards" / "results.1.jsonl").write_text(json.dumps(mine[1][0]) + "\n" + json.dumps(mine[1][1])[:40])
    kept = {(r["prompt_id"], r["method"], r["temperature"]): r["seconds"] for r in mine[0] + mine[1][:1]}
    proc = subprocess.run(
        [sys.executable, "-m", "multispec", *common, "--out", str(died), "--processes", "2", "--resume"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = read_results(died / "results.jsonl")
    assert [[r[k] for k in key] for r in resumed] == [[r[k] for k in key] for r in one]  # each row once
    for r in resumed:  # finished rows kept as they were (their timing too), the rest run now
        if (r["prompt_id"], r["method"], r["temperature"]) in kept:
            assert r["seconds"] == kept[(r["prompt_id"], r["method"], r["temperature"])]
    assert sum((r["prompt_id"], r["method"], r["temperature"]) not in kept for r in resumed) == len(mine[1]) - 1
    for a, b in zip(one, resumed, strict=True):
        assert {k: a[k] for k in DETERMINED} == {k: b[k] for k in DETERMINED}


def test_cost_curve_file_round_trip_and_errors(tmp_path, tiny_pair, capsys):
    from multispec.models.cost import read_cost_curves

    for name, model in zip(("target", "draft"), tiny_pair, strict=True):
        model.model.save_pretrained(tmp_path / name)
    out = tmp_path / "curves" / "cpu.json"
    models = ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft")]
    assert main(["cost-curve", *models, "--out", str(out), "--repeats", "1"]) == 0
    assert "T(1)" in capsys.readouterr().out
    curves, data = read_cost_curves(out)
    assert set(curves) == {"target", "draft"} and data["device"].startswith("cpu") and data["date"]
    for c in curves.values():
        row = c.seconds[0]
        assert all(b >= a > 0 for a, b in zip(row, row[1:], strict=False))  # never cheaper for more tokens
        assert c(c.tokens[-1] + 5) >= c(c.tokens[-1])
    assert main(["cost-curve", *models, "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a cost-curve file"):
        read_cost_curves(tmp_path / "other.json")
