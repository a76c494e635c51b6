"""The evaluation harness: prompt sets, metrics, energy meters, the run loop and the report.

from multispec.tools.bench import load_prompts, run_bench
summary = run_bench(pair.target, pair.draft, load_prompts(["prompts.jsonl"], limit=10),
                    ["ar", "sd:gamma=4", "hf"], out="bench-out", temperatures=[0, 1])
"""

from __future__ import annotations

from ...data import PROMPT_SETS, data_dir, prompt_file
from .energy import Meter, NVMLMeter, RAPLMeter, pick_meter
from .prompts import Prompt, load_prompt_file, load_prompts, select_prompts
from .report import summarise, write_report
from .runner import (
    BASELINES,
    MethodSpec,
    check_settings,
    default_methods,
    parse_method_spec,
    plan,
    prepare_out,
    read_results,
    run_bench,
)

# --preset NAME: settings filled in where the command line gives none
PRESETS = {
    "smoke": {
        "methods": ["ar", "sd:gamma=4", "hf", "hf-assisted"],
        "temperatures": [0.0],
        "max_new_tokens": 32,
    },
}


def preset_prompts(name: str) -> list[Prompt]:
    """The prompts of a preset. smoke: the first MT-Bench question of three categories (two of them with
    references, so the text metrics show) and the first two WMT En→De prompts."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    mt = load_prompt_file("mt-bench")
    chosen = [p for c in ("writing", "reasoning", "math") for p in [q for q in mt if q.category == c][:1]]
    return chosen + load_prompt_file("wmt-ende", limit=2)


__all__ = [
    "BASELINES",
    "PRESETS",
    "PROMPT_SETS",
    "Meter",
    "MethodSpec",
    "NVMLMeter",
    "Prompt",
    "RAPLMeter",
    "check_settings",
    "data_dir",
    "default_methods",
    "prompt_file",
    "load_prompt_file",
    "load_prompts",
    "parse_method_spec",
    "pick_meter",
    "plan",
    "prepare_out",
    "preset_prompts",
    "read_results",
    "run_bench",
    "select_prompts",
    "summarise",
    "write_report",
]
