"""transformers alone (multispec never imported): the default target's checkpoint, greedy, 128 tokens, the chat
template, on the first four prompts of prompts.jsonl, bfloat16 then float32."""

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(2)
path = Path.home() / ".cache/multispec/smollm2-135m-instruct-f32"
tok = AutoTokenizer.from_pretrained(path)
prompts = [json.loads(line) for line in open(Path(__file__).parent / "prompts.jsonl")][:4]
for dtype in (torch.bfloat16, torch.float32):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    speeds = []
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                      return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=8, do_sample=False)
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=128, do_sample=False)
            seconds = time.perf_counter() - t0
        speeds.append(round((out.shape[1] - ids.shape[1]) / seconds, 1))
    print(dtype, speeds, "multispec imported:", "multispec" in sys.modules)
