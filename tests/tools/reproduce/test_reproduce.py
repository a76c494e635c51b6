"""`multispec reproduce`: the paired bootstrap, the verdict rule, and the whole --quick report on tiny models."""

import json
import math

import numpy as np
import pytest

from multispec.entrypoints.cli import main
from multispec.tools.reproduce import Estimate, all_claims, paired_bootstrap, verdict
from multispec.tools.reproduce.stats import DIRECTION, NOT, REPRODUCED, per_call_ratio, throughput_ratio
from tests.conftest import tiny_llama

# -- the paired bootstrap --------------------------------------------------------------------------


def test_pairing_keeps_each_prompts_rows_together():
    """a is exactly twice b on every prompt while b varies a lot: resampling prompts (not rows
    independently) keeps the ratio exactly 2 in every resample."""
    b = np.array([1.0, 10.0, 3.0, 40.0, 7.0, 2.0])
    est = paired_bootstrap(lambda x, y: x.sum() / y.sum(), 2 * b, b)
    assert est.value == est.low == est.high == pytest.approx(2.0) and est.n == 6


def test_interval_narrows_with_more_prompts_and_covers_the_truth():
    rng = np.random.default_rng(1)
    widths = []
    for n in (10, 200):
        tokens = rng.integers(50, 150, n).astype(float)
        secs_b = tokens / 20 * rng.uniform(0.8, 1.2, n)
        secs_a = secs_b / 1.5 * rng.uniform(0.9, 1.1, n)
        est = paired_bootstrap(throughput_ratio, tokens, secs_a, tokens, secs_b)
        widths.append(est.high - est.low)
        assert est.low < 1.5 < est.high
    assert widths[1] < widths[0] / 2


def test_statistics_by_hand():
    # 10 tokens in 2 calls (5 per call) against 12 tokens in 4 calls (3 per call)
    assert per_call_ratio(
        np.array([4.0, 6.0]), np.array([1.0, 1.0]), np.array([6.0, 6.0]), np.array([2.0, 2.0])
    ) == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="one non-zero length"):
        paired_bootstrap(np.mean, np.array([]))


# -- the verdict rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "low,high,direction,expected,want",
    [
        (1.30, 1.60, +1, (1.42, 1.42), REPRODUCED),  # above 1 and holds the paper's 1.42
        (1.05, 1.20, +1, (1.42, 1.42), DIRECTION),  # faster, not as much
        (0.90, 1.60, +1, (1.42, 1.42), NOT),  # holds 1: no effect shown
        (0.50, 0.80, +1, (1.42, 1.42), NOT),  # the other way
        (1.60, 1.70, +1, (1.5, 1.9), REPRODUCED),  # overlaps the paper's range
        (2.00, 2.20, +1, (1.5, 1.9), DIRECTION),  # beyond the range
        (0.70, 0.85, -1, (0.79, 0.79), REPRODUCED),  # lower perplexity by about the paper's amount
        (0.95, 0.99, -1, (0.79, 0.79), DIRECTION),
        (1.01, 1.10, -1, None, NOT),
        (0.97, 1.03, 0, None, REPRODUCED),  # equal within the 5 % margin
        (0.80, 1.20, 0, None, NOT),  # holds 1 but too wide to show equality
        (1.07, 1.20, 0, None, NOT),
        (math.nan, math.nan, +1, None, NOT),
    ],
)
def test_verdicts(low, high, direction, expected, want):
    assert verdict(Estimate((low + high) / 2, low, high, 10), 1.0, direction, expected) == want


# -- the whole report on tiny models ---------------------------------------------------------------


def _tiny_tokenizer(vocab: int = 300):
    """A real byte-level BPE tokenizer (tokenizers + transformers), trained here on a few sentences that are
    not in any prompt set."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [
        "a small draft proposes and a large target verifies in one pass",
        "the quick brown fox jumps over the lazy dog",
        "speculative decoding keeps the target's distribution when the rule is exact",
    ] * 20
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.slow
def test_quick_report_on_tiny_models_has_every_claim_with_interval_and_verdict(tmp_path, capsys):
    tokenizer = _tiny_tokenizer()
    for name, seed in (("target", 0), ("draft", 1)):
        model = tiny_llama(vocab=len(tokenizer), seed=seed, max_positions=4096)
        model.model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    pair = ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft")]
    curve = tmp_path / "device.json"
    assert main(["cost-curve", *pair, "--out", str(curve), "--repeats", "1"]) == 0
    out = tmp_path / "report"
    args = ["reproduce", "--quick", *pair, "--out", str(out), "--device-curve", str(curve)]
    assert main(args) == 0
    printed = capsys.readouterr().out

    data = json.loads((out / "claims.json").read_text())
    ids = {c.id for c in all_claims()}
    measured = {r["id"] for r in data["claims"]}
    skipped = {s["id"]: s["reason"] for s in data["not_measured"]}
    assert measured | set(skipped) == ids and not measured & set(skipped)
    assert all(i.split(".")[1].startswith("energy") and "energy meter" in r for i, r in skipped.items())
    for r in data["claims"]:
        lo, hi = r["interval"]
        assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi, r
        assert r["verdict"] in (REPRODUCED, DIRECTION, NOT) and r["n"] >= 2, r
        assert r["our_setting"] and r["cause"] and not r["cause"].startswith("not measured"), r
        assert f"`{r['id']}`" in printed
    report = (out / "REPORT.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| **")]
    assert len(rows) == len(data["claims"]) and all("** |" in line for line in rows) and "no GPU here" in report
    assert "Projection to" in report and "not a measurement" in report and data["projection"]["formula"] in report
    for figure in ("claims.png", "tau_sweep.png", "theory.png"):
        assert (out / figure).stat().st_size > 0 and f"]({figure})" in report

    # an earlier report is neither overwritten nor silently continued; --resume runs nothing again
    assert main(args) == 2 and "--resume" in capsys.readouterr().err
    lengths = {p: len(p.read_text().splitlines()) for p in out.glob("*/results.jsonl")}
    theory = (out / "theory" / "theory.json").read_text()
    assert main([*args, "--resume"]) == 0
    assert {p: len(p.read_text().splitlines()) for p in out.glob("*/results.jsonl")} == lengths
    assert (out / "theory" / "theory.json").read_text() == theory
    capsys.readouterr()
    assert main(["reproduce", "--claims", "mcsd,magic", *pair, "--out", str(tmp_path / "x")]) == 2
    assert "unknown claim 'magic'" in capsys.readouterr().err and not (tmp_path / "x").exists()
