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
