"""What a new user meets first: prompt sets by name, quick help, the methods list, one-line errors for
bad devices, files, temperatures and seeds, several end-of-sequence ids."""

import json
import subprocess
import sys

import pytest
import torch

from multispec import generate
from multispec.data import PROMPT_SETS, prompt_file
from multispec.entrypoints.cli import main
from multispec.models.hf import HFModel
from multispec.tools.bench import load_prompt_file
from tests.conftest import tiny_llama


@pytest.mark.parametrize(
    "name, count, categories", [("mt-bench", 80, 8), ("spec-bench-dev", 100, 5), ("wmt-ende", 1000, 1)]
)
def test_prompt_sets_ship_with_the_package_and_load_by_name(name, count, categories):
    prompts = load_prompt_file(name)
    assert len(prompts) == count and len({p.category for p in prompts}) == categories
    assert prompt_file(name).parent.name == "data" and prompt_file(name).name == PROMPT_SETS[name]


def test_prompt_sets_follow_multispec_data(tmp_path, monkeypatch):
    (tmp_path / "mt_bench.jsonl").write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n")
    monkeypatch.setenv("MULTISPEC_DATA", str(tmp_path))
    assert [p.text for p in load_prompt_file("mt-bench")] == ["hi"]
    with pytest.raises(ValueError, match="'wmt-ende' is not in"):
        load_prompt_file("wmt-ende")


def test_help_is_quick_and_loads_no_torch():
    code = (
        "import sys; from multispec.entrypoints.cli import build_parser; build_parser().format_help(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "multispec.entrypoints.cli", "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "train a draft." in " ".join(help_text.split())  # the description is whole


def test_generate_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: sd:gamma=auto,drafter=hybrid)" in out and "(default: 128)" in out and "(default: None)" not in out


def test_methods_lists_the_registry_with_parameters_and_exactness(capsys):
    from multispec.decoding import METHODS

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name, m in METHODS.items():
        assert f"{name}: {m.summary}" in out and m.exact in out
        for key in m.params:
            assert f"  {key} = " in out
    assert main(["methods", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["sd"]["params"]["gamma"]["default"] == 4 and listed["ar"]["draft"] == "none"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "hi", "--temperature", "inf"], "temperature must be a finite number"),
        (["generate", "hi", "--seed", "99999999999999999999"], "seed must be an integer in [0, 2**63)"),
        (["generate", "hi", "--seed", "-1"], "seed must be an integer"),
        (["generate", "hi", "--device", "warp9"], "not a torch device"),
        (["bench", "--prompts", "no-such-set"], "prompt sets by name: mt-bench"),
        (["generate", "hi", "--method", "sd:drafter=ngram"], "drafter must be"),
        (["generate", "hi", "--method", "sd:drafter=lookup,min_ngram=3,max_ngram=2"], "min_ngram (3)"),
    ],
)
def test_more_bad_input_is_one_line_with_status_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("multispec: error:")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_is_one_line(capsys):
    assert main(["generate", "hi", "--device", "cuda", "--method", "ar"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no CUDA device" in err and "\n" not in err


def test_a_corrupt_weights_file_is_one_line(tmp_path, capsys):
    tiny_llama().model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01 not a safetensors file" * 10)
    assert main(["generate", "hi", "--target", str(tmp_path), "--method", "ar"]) == 2
    err = capsys.readouterr().err.strip()
    assert "could not load model" in err and "\n" not in err


def test_every_end_of_sequence_id_ends_the_output():
    base = tiny_llama(seed=4)
    free = generate(base, None, [3, 4, 5], method="ar", temperature=0, max_new_tokens=12).token_ids
    second_stop = free[2]  # greedy emits it third; make it the second of two stop ids
    base.model.generation_config.eos_token_id = [63 if second_stop != 63 else 62, second_stop]
    model = HFModel(base.model, None, name="two-stops")
    assert model.stop_tokens == frozenset(base.model.generation_config.eos_token_id)
    for method, params in (("ar", {}), ("sd", {"gamma": 3, "drafter": "lookup"})):
        out = generate(model, None, [3, 4, 5], method=method, temperature=0, max_new_tokens=12, **params)
        assert out.token_ids == free[:3] and out.stats["stopped"] == "eos"
    # beam search may choose other words, but no stop id may appear before its end
    out = generate(model, None, [3, 4, 5], method="beam", width=2, temperature=0, max_new_tokens=12).token_ids
    assert not any(t in model.stop_tokens for t in out[:-1])
