"""One default method for the library and the command line."""

import inspect

from multispec.api import generate
from multispec.decoding import DEFAULT_METHOD
from multispec.entrypoints.cli import build_parser
from multispec.models.markov import random_markov_pair


def test_library_and_command_line_share_one_default():
    assert DEFAULT_METHOD == "sd:gamma=auto,drafter=hybrid"
    assert inspect.signature(generate).parameters["method"].default == DEFAULT_METHOD
    assert build_parser().parse_args(["generate", "hello"]).method == DEFAULT_METHOD


def test_generate_without_a_method_runs_the_default():
    target, draft = random_markov_pair(8, 40, 0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    plain = generate(target, draft, prompt, max_new_tokens=20, seed=3)
    named = generate(target, draft, prompt, method="sd", gamma="auto", drafter="hybrid", max_new_tokens=20, seed=3)
    spec = generate(target, draft, prompt, method="sd:gamma=auto,drafter=hybrid", max_new_tokens=20, seed=3)
    none = generate(target, draft, prompt, method=None, max_new_tokens=20, seed=3)  # as generate_batch takes it
    assert plain.token_ids == named.token_ids == spec.token_ids == none.token_ids
    assert "drafter_iterations" in plain.stats  # gamma=auto ran, with the hybrid's drafters
    # keyword parameters override those in the spec
    fixed = generate(target, draft, prompt, method="sd:gamma=auto", gamma=2, max_new_tokens=20, seed=3)
    assert "drafter_iterations" not in fixed.stats
