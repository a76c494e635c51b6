"""Bad input: a ValueError naming the value from the API; one line and exit code 2 from the CLI."""

import subprocess
import sys

import pytest

from multispec import generate
from multispec.entrypoints.cli import main
from multispec.models.markov import random_markov_pair
from tests.conftest import tiny_llama

TARGET, DRAFT = random_markov_pair(4, 20, seed=0)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"prompt": []}, "empty"),
        ({"prompt": "   "}, "empty"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("inf")}, "finite"),
        ({"seed": 2**64}, "seed"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"method": "sd", "gamma": 0}, "gamma"),
        ({"method": "sd", "gamma": "many"}, "gamma"),
        ({"method": "beam", "width": 0}, "width"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"method": "nonsense"}, "unknown method 'nonsense'"),
        ({"method": "ar", "gamma": 2}, "no parameter 'gamma'"),
        ({"prompt": [0, 9]}, "token id 9"),
        ({"prompt": "text for a model without tokenizer"}, "no tokenizer"),
    ],
)
def test_api_errors_name_the_problem(kwargs, needle):
    args = {"prompt": [0], "method": "sd", **kwargs}
    prompt = args.pop("prompt")
    with pytest.raises(ValueError, match=needle):
        generate(TARGET, DRAFT, prompt, **args)


def test_prompt_longer_than_context():
    model = tiny_llama(max_positions=16)
    with pytest.raises(ValueError, match="20 tokens.*context of 16"):
        generate(model, None, list(range(20)), method="ar")


def test_sd_without_a_draft():
    with pytest.raises(ValueError, match="needs a draft"):
        generate(TARGET, None, [0], method="sd")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--top-p", "0"], "top_p"),
        (["generate", "hi", "--top-k", "-1"], "top_k"),
        (["generate", "hi", "--gamma", "0"], "gamma"),
        (["generate", "hi", "--method", "beam", "--width", "0"], "width"),
        (["generate", "hi", "--max-new-tokens", "-5"], "max_new_tokens"),
        (["generate", "hi", "--method", "warp-drive"], "unknown method"),
        (["generate", ""], "empty"),
        (["generate", "hi", "--param", "gamma"], "KEY=VALUE"),
        (["check", "--method", "sd:gamma=x"], "gamma must be an integer"),
    ],
)
def test_cli_errors_are_one_line_with_status_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and err.startswith("multispec: error:")


def test_cli_mismatched_vocabularies_in_a_subprocess(tmp_path):
    """A real draft directory whose vocabulary differs from the default target's."""
    model = tiny_llama(vocab=80)
    model.model.save_pretrained(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "multispec.entrypoints.cli", "generate", "hello", "--draft", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    # on a fresh cache the target's one-time GGUF conversion shows its progress bar above the error
    err = proc.stderr.strip()
    last = err.splitlines()[-1]
    assert "Traceback" not in err and last.startswith("multispec: error:"), err
    assert "49152" in last and "80" in last


def test_a_draft_whose_tokenizer_maps_other_ids_is_refused_and_a_matching_one_checked_once():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from multispec import api

    def tokenizer(words):
        vocab = {w: i for i, w in enumerate(words)}
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token=words[0])))

    words = [f"w{i}" for i in range(64)]
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    target.tokenizer, draft.tokenizer = tokenizer(words), tokenizer(words[1::-1] + words[2:])  # two ids swapped
    with pytest.raises(ValueError, match="tokenizers differ .* same size but different token ids"):
        generate(target, draft, [1, 2, 3], method="sd:gamma=2", max_new_tokens=4, temperature=0)
    draft.tokenizer = tokenizer(words)
    api.check_compatible(target, draft)
    assert (id(target.tokenizer), id(draft.tokenizer)) in api._SAME_VOCAB
    out = generate(target, draft, [1, 2, 3], method="sd:gamma=2", max_new_tokens=4, temperature=0)
    assert len(out.token_ids) == 4


@pytest.mark.parametrize(
    "method,param", [("sd", "gamma"), ("beam", "width"), ("batch-sd", "drafts"), ("bild", "max_unchecked")]
)
def test_the_library_refuses_sizes_that_would_exhaust_memory(method, param):
    target = tiny_llama(seed=3)
    with pytest.raises(ValueError, match=rf"{param} must be an integer in \[1, \d+\]( or 'auto')?, got 10000000000"):
        generate(target, tiny_llama(seed=4), [1, 2], method=method, max_new_tokens=4, **{param: 10**10})
