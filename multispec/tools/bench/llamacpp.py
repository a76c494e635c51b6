"""The `llama-cpp` peer: llama.cpp (through `llama-cpp-python`) on a GGUF file of the target, the usual choice
of a CPU user. Optional: it runs only where `llama-cpp-python` is installed, which builds llama.cpp from
source (see docs/benchmarks.md for the build flags).

It decodes the prompt's token ids as our methods do (the GGUF must hold the target's vocabulary; checked on
load), with llama.cpp's own sampler chain set to the bench's law: greedy at temperature 0, else top-k, top-p
and temperature with every other llama.cpp sampler switched off (min-p 0, typical 1, no repeat penalty).
llama.cpp applies top-p before the temperature, transformers and this project after it: the laws agree
unless top-p < 1 with a temperature other than 1.
"""

from __future__ import annotations

import time
from pathlib import Path

INSTALL = (
    "pip install llama-cpp-python (it builds llama.cpp; on this project's CPUs: CMAKE_ARGS=\"-DGGML_NATIVE=OFF "
    '-DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")'
)


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def require() -> None:
    if not available():
        raise ValueError(f"the llama-cpp peer needs the package llama-cpp-python, which is not installed: {INSTALL}")


def gguf_for(target, given: str | Path | None = None) -> Path:
    """The GGUF file the peer runs: `given`, else the shipped file the default target was converted from."""
    if given is not None:
        path = Path(given)
        if not path.is_file():
            raise ValueError(f"--gguf {path}: no such file")
        return path
    from ...models.default import TARGET_NAME, gguf_path

    if getattr(target, "name", None) == TARGET_NAME:
        return gguf_path()
    raise ValueError(
        f"the llama-cpp peer needs a GGUF file of the target {getattr(target, 'name', target)!r}: "
        "give it with --gguf FILE (run_bench(gguf=...))"
    )


class LlamaCppPeer:
    """One llama.cpp context on a GGUF file, reused for every generation of a bench."""

    def __init__(self, path: str | Path, threads: int, target=None):
        require()
        from llama_cpp import Llama

        self.path = Path(path)
        # n_ctx=0: the model's trained context; one sequence, as our methods decode one prompt at a time
        self.llama = Llama(
            model_path=str(self.path),
            n_ctx=0,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
        )
        self.name = f"llama.cpp on {self.path.name}"
        if target is not None:
            self._check_vocabulary(target)

    def _check_vocabulary(self, target) -> None:
        n = self.llama.n_vocab()
        if n != target.vocab_size:
            raise ValueError(
                f"{self.path.name} has a vocabulary of {n} tokens, the target {target.vocab_size}: "
                "the llama-cpp peer needs a GGUF of the target itself"
            )
        probe = "The quick brown fox, 42 times: naïve café."
        ours = target.encode(probe, chat=False)
        theirs = self.llama.tokenize(probe.encode("utf-8"), add_bos=False, special=False)
        if [t for t in ours if t not in target.stop_tokens] != list(theirs):
            raise ValueError(
                f"{self.path.name} tokenises text differently from the target: the llama-cpp peer needs "
                "a GGUF of the target itself"
            )

    def generate(self, ids: list[int], max_new_tokens: int, sampling, seed: int, stop_tokens) -> tuple[list[int], dict]:
        """Decode up to `max_new_tokens` after `ids` (prefill included in the time), stopping at a stop token.
        `target_calls` counts llama.cpp evaluations (the prompt's is one, as for the other methods)."""
        llama = self.llama
        calls = 0
        evaluate = llama.eval

        def counted(tokens):
            nonlocal calls
            calls += 1
            evaluate(tokens)

        if sampling.greedy:
            law = {"temp": 0.0}
        else:  # llama.cpp's top_k <= 0 is off, as ours
            law = {"temp": float(sampling.temperature), "top_k": sampling.top_k, "top_p": float(sampling.top_p)}
        law.update(min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
        llama.set_seed(seed)
        llama.reset()  # no prompt reuse between calls: every call pays its prefill, as ours do
        llama.eval = counted
        tokens: list[int] = []
        stopped = "length"
        try:
            t0 = time.perf_counter()
            for token in llama.generate(ids, reset=True, **law):
                tokens.append(int(token))
                if token in stop_tokens:
                    stopped = "eos"
                    break
                if len(tokens) >= max_new_tokens:
                    break
            seconds = time.perf_counter() - t0
        finally:
            del llama.eval  # the class's method again
        return tokens, {
            "seconds": seconds,
            "target_calls": calls,
            "draft_calls": 0,
            "acceptance_rate": None,
            "stopped": stopped,
        }
