import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

# inductor's C++ wrapper of a packaged step (the calls into its kernels; no arithmetic of its own) is compiled at
# -O0 in the suite instead of -O1: ~4 s of g++ per package instead of ~6, the same kernels and bits
os.environ.setdefault("AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL", "O0")

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):  # one core per worker (the README's command runs two)
    torch.set_num_threads(1)
    # and for the processes a test starts (a CLI run, a server): two of them at 2 threads each on 2 cores ran a
    # first `generate` in over 400 s instead of 86 s, their OpenMP threads spinning against each other
    os.environ["OMP_NUM_THREADS"] = "1"

# compile="auto" (every entry point's default) stays eager in tests whatever the host: no background compile worker
# starts beside the suite (the tests of that default set MULTISPEC_COMPILE themselves)
os.environ["MULTISPEC_COMPILE"] = "eager"


def _run_folder(what: str, run: str | None) -> str:
    """A folder of this run under the temp directory: the workers of an xdist run share one (named by the run's id);
    a process of its own (a run without workers, the process that starts them) makes its own. Removed when the
    run ends (`pytest_sessionfinish`)."""
    if run:
        return os.path.join(tempfile.gettempdir(), f"multispec-tests-{what}-{run}")
    return tempfile.mkdtemp(prefix=f"multispec-tests-{what}-")


# inductor's generated code and compiled kernels go to one cache for the run, shared by its workers and the processes
# tests start: a tiny model's step compiled by one test is largely reused by the next (a kept step of a 2-layer Llama
# built in ~18 s instead of ~32), and nothing is read from or left in the user's own cache
_run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _run_folder("inductor", _run)
# packages built in this run, shared by its workers (`_packages_built_once`)
_BUILT = Path(_run_folder("packages", _run))
# cost curves measured by tests (two workers share the cores) go to a file of this process, not the user's cache,
# where gamma=auto, tree=auto and tune would read them later; subprocesses inherit it
_COSTS = tempfile.mkdtemp(prefix="multispec-tests-costs-")
os.environ["MULTISPEC_COST_FILE"] = os.path.join(_COSTS, "forward_cost.json")


def pytest_configure(config):
    # the process that starts xdist's workers names the run, so that it can remove the folders they share at the end
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "") is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session):
    folders = [_COSTS]
    if not _run:  # a worker's shared folders are removed by the process that started the workers, after all ended
        folders += [os.environ["TORCHINDUCTOR_CACHE_DIR"], str(_BUILT)]
    run = getattr(session.config.option, "testrunuid", None)
    if run and not hasattr(session.config, "workerinput"):
        folders += [_run_folder(what, run) for what in ("inductor", "packages")]
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def tiny_llama(vocab: int = 64, seed: int = 0, layers: int = 2, hidden: int = 32, max_positions: int = 128):
    """A small random Llama built from a config: real transformers code, no download."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from multispec.models.hf import HFModel

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float()
    # sharpen the random output so greedy choices are not near-ties
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return HFModel(model, None, name=f"tiny-llama-{vocab}-{seed}")


def pytest_collection_modifyitems(items):
    # what loads the default pair (a 135M model) is slow: `-m "not slow"` leaves it out
    for item in items:
        if {"default_pair", "default_pair_f32"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def default_pair():
    from multispec import load_pair

    return load_pair()


@pytest.fixture(scope="session")
def default_pair_f32():
    """The default pair in float32, where greedy speculative outputs equal greedy ar token for token."""
    from multispec import load_pair

    return load_pair(dtype="float32")


FAMILIES = [
    "Llama",
    "Mistral",
    "Qwen2",
    "Qwen3",
    "Gemma",
    "Gemma2",
    "Gemma3Text",
    "Phi3",
    "OPT",
    "GPT2",
    "GPTNeoX",
    "Falcon",
]


def tiny_family(family: str, vocab: int = 64, seed: int = 0):
    """A small random model of one transformers family, built from its config (no download). Sliding-window
    families get a window of 4, shorter than the prompts and outputs of the tests."""
    import transformers

    from multispec.models.hf import HFModel

    config_class = getattr(transformers, f"{family}Config")
    model_class = getattr(
        transformers, "GPT2LMHeadModel" if family == "GPT2" else f"{family.removesuffix('Text')}ForCausalLM"
    )
    size = {"vocab_size": vocab, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    if family == "GPT2":
        size.update(n_embd=32, n_layer=2, n_head=4, n_positions=128)
    elif family == "OPT":
        size.update(
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=128,
        )
    else:
        size.update(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=128,
        )
        if family not in ("GPTNeoX", "Falcon"):
            size["num_key_value_heads"] = 2
        if family.startswith(("Gemma", "Qwen3")):
            size["head_dim"] = 8
        if family in ("Mistral", "Gemma2", "Gemma3Text"):
            size["sliding_window"] = 4
    torch.manual_seed(seed)
    model = model_class(config_class(**size)).float()
    with torch.no_grad():  # sharpen the random output so greedy choices are not near-ties
        model.get_output_embeddings().weight.mul_(4.0)
    return HFModel(model, None, name=f"tiny-{family}")


@pytest.fixture(autouse=True, scope="session")
def _packages_built_once():
    """A step the run has already compiled into a package is copied, not compiled again. Tests keep their own
    package folders (a test that counts compiles or damages a package sees only its own), and several build the
    same step: the same weights, shape and kernel variant, in a model of another test. Each step is still
    exported by the code under test; the copy is taken only for the same key (architecture, weights, dtype,
    machine), name (variant, shape, cache type, layers returned), inductor options and exported graph, shapes and
    types written beside every node, so a known-wrong step (another graph) is compiled as itself."""
    from multispec.models import packaged

    def build(path, key, model, run, args, kernels):
        program = packaged.export(model, run, args)
        graph = program.graph_module.print_readable(print_output=False, include_stride=True, include_device=True)
        digest = hashlib.sha256("\0".join([key, path.name, repr(sorted(kernels.items())), graph]).encode())
        kept = _BUILT / f"{digest.hexdigest()}.pt2"
        if kept.is_file():
            _copy(kept, path)
            (path.parent / "key.json").write_text(json.dumps({"key": key}))  # as `packaged.compile_program` does
        else:
            packaged.compile_program(path, key, program, kernels)
            _copy(path, kept)  # (two workers keeping one step keep the same)

    original, packaged.build = packaged.build, build
    yield
    packaged.build = original


def _copy(source: Path, dest: Path) -> None:
    """Copy a file with its mode, written under another name and renamed (a concurrent reader never sees half)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".copying-")
    os.close(fd)
    shutil.copy(source, tmp)
    os.replace(tmp, dest)
