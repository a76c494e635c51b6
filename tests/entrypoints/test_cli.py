"""The command line as a user runs it."""

import json
import re
import subprocess
import sys

import pytest


def run(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "multispec.entrypoints.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_generate_json_on_the_default_pair():
    proc = run("generate", "Name a colour.", "--temperature", "0", "--max-new-tokens", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["method"] == "sd" and len(out["token_ids"]) == out["stats"]["new_tokens"] <= 12
    assert out["text"] and out["stats"]["target_calls"] >= 1
    for key in ("new_tokens", "target_calls", "draft_calls", "drafted", "accepted", "seconds"):
        assert key in out["stats"]


@pytest.mark.slow
def test_generate_streams_text_and_prints_a_summary():
    proc = run("generate", "Name a colour.", "--method", "ar", "--temperature", "0", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("[ar] ") and "tokens/s" in lines[-1] and "target calls" in lines[-1]
    assert re.search(r"perplexity \d+\.\d\d", lines[-1]), lines[-1]
    assert len("".join(lines[:-1]).strip()) > 0


@pytest.mark.slow
def test_generate_over_a_prompt_file_in_a_batch_resumes_where_it_stopped(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"id": i, "prompt": p}) for i, p in enumerate(["Hi.", "Name a fruit."])]
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    args = ("generate", "--prompts", str(prompts), "--batch", "2", "--max-new-tokens", "6", "--temperature", "0")
    proc = run(*args, "--method", "ar", "--out", str(out), "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    assert "1 prompts" in proc.stderr and "tokens/s in all" in proc.stderr
    proc = run(*args, "--method", "ar", "--out", str(out))  # the first is in --out already: only the second runs
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == ["prompts:0", "prompts:1"]
    alone = run("generate", "Name a fruit.", "--method", "ar", "--max-new-tokens", "6", "--temperature", "0", "--json")
    assert json.loads(alone.stdout)["token_ids"] == next(x for x in lines if x["id"] == "prompts:1")["token_ids"]
    bad = run("generate", "Hi.", "--prompts", str(prompts))
    assert bad.returncode != 0 and "one of them" in bad.stderr


def test_beam_from_the_cli():
    proc = run(
        "generate",
        "Name a colour.",
        "--method",
        "beam",
        "--width",
        "2",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["new_tokens"] <= 6


def test_check_passes_for_sd_and_reports_statistics():
    proc = run("check", "--method", "sd:gamma=2", "--runs", "3000", "--pairs", "1", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["passed"] and out["pairs"][0]["p_value"] > 1e-3
    assert {"chi2", "p_value", "tv"} <= set(out["pairs"][0])


def test_check_fails_with_status_1_for_a_method_of_another_law():
    proc = run("check", "--method", "beam:width=3", "--runs", "3000", "--pairs", "1")
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "p-value" in proc.stdout
