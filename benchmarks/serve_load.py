"""Load on `multispec serve` as a user starts it: the server in a subprocess, C concurrent streaming
`openai` clients x R requests each, for every C of `--clients`; aggregate tokens/s, time to first text and
latency (p50, p99) per method and concurrency.

    python benchmarks/serve_load.py --out benchmarks/results/serve-concurrency --clients 1,2,4,8,16 \
        --requests 2 --max-tokens 128 --method ar --method default --prompts mt-bench,spec-bench-dev \
        --server-arg=--batch-rows=16 --baseline

`--method default` sends no method (the server's default). `--prompts`: shipped sets (or JSONL files), their first
turns taken in turn from each; client c's request r gets prompt c * R + r. Greedy unless `--temperature`.
`--server-arg` passes an option to `multispec serve` (`--server-arg=--batch-rows=1`: one request at a time).
`--baseline`: after the server has stopped (never two torch jobs at once), transformers as it ships, on the
default target in the server's dtype (or `--baseline-dtype`), for every C: its `generate` over the C clients'
first prompts in one left-padded batch, and its continuous batching (`generate_batch`) over all C x R prompts;
greedy, the same chat template, `max_tokens` new tokens each (no early stop): the aggregate tokens/s to compare
the server's with.
`--baseline-only`: transformers alone (into `baseline.json`), no server.
`--device cuda`: the server and transformers on a GPU (transformers in bfloat16).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

PROMPTS = [
    "Name three colours.",
    "Give me two tips for sleeping well.",
    "What is the capital of Italy?",
    "Write one sentence about the sea.",
    "Translate to German: good morning, my friend.",
    "List four fruits.",
    "Explain what a verb is in one sentence.",
    "Say something kind.",
]


def load_prompts(names: str) -> list[str]:
    """The first turns of the named sets, one from each in turn."""
    from multispec.tools.bench.prompts import load_prompt_file

    sets = [[p.text for p in load_prompt_file(name)] for name in names.split(",")]
    return [texts[i] for i in range(max(map(len, sets))) for texts in sets if i < len(texts)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_load(
    port: int, method: str, clients: int, requests: int, max_tokens: int, prompts: list[str], temperature: float
) -> list[dict]:
    rows: list[dict] = []
    lock = threading.Lock()

    def client_loop(c: int):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=900)
        for r in range(requests):
            t0 = time.perf_counter()
            first = None
            stream = client.chat.completions.create(
                model="multispec",
                messages=[{"role": "user", "content": prompts[(c * requests + r) % len(prompts)]}],
                max_tokens=max_tokens,
                temperature=temperature,
                seed=1000 * c + r,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={} if method == "default" else {"method": method},
            )
            finish, usage, spec = None, None, None
            for chunk in stream:
                if chunk.choices:
                    if chunk.choices[0].delta.content and first is None:
                        first = time.perf_counter() - t0
                    if chunk.choices[0].finish_reason:
                        finish, spec = chunk.choices[0].finish_reason, chunk.spec_decode
                if chunk.usage is not None:
                    usage = chunk.usage
            seconds = time.perf_counter() - t0
            with lock:
                rows.append(
                    {
                        "client": c,
                        "request": r,
                        "seconds": seconds,
                        "first_text_seconds": first,
                        "finish": finish,
                        "completion_tokens": usage.completion_tokens,
                        "decode_seconds": spec["seconds"],
                        "acceptance_rate": spec["acceptance_rate"],
                    }
                )

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows


def percentiles(values: list[float]) -> dict:
    if len(values) < 2:
        return dict.fromkeys(("p50", "p90", "p99", "max"), values[0] if values else None)
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", default="8", help="concurrent clients: one count or several (1,2,4,8)")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--method", action="append", default=None, help="repeatable; `default`: the server's")
    ap.add_argument("--prompts", default=None, help="shipped sets or JSONL files, comma-separated (default: 8 short)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--server-arg", action="append", default=[], help="an option for `multispec serve`")
    ap.add_argument("--baseline", action="store_true", help="also time transformers' batched generate")
    ap.add_argument("--baseline-only", action="store_true", help="transformers alone, no server")
    ap.add_argument(
        "--baseline-dtype", default=None, help="transformers' dtype (default: the server's; on CUDA bfloat16)"
    )
    ap.add_argument("--device", default=None, help="the server's and the baseline's device (cuda: bfloat16)")
    args = ap.parse_args()
    counts = [int(c) for c in str(args.clients).split(",")]
    prompts = load_prompts(args.prompts) if args.prompts else PROMPTS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.baseline_only:
        report = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "clients": counts}
        report["transformers"] = baseline(
            counts, args.requests, args.max_tokens, prompts, args.device or "cpu", args.baseline_dtype
        )
        (out / "baseline.json").write_text(json.dumps(report, indent=1))
        return 0
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "multispec",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--max-queue",
            str(max(counts)),
            *(["--device", args.device] if args.device else []),
            *args.server_arg,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    print(server.stderr.read(), file=sys.stderr)
                    return 1
                time.sleep(0.5)
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "clients": counts,
            "requests": args.requests,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "prompts": args.prompts or "8 short built-in prompts",
            "server_args": args.server_arg,
            "device": args.device or "cpu",
            "runs": [],
        }
        for clients, method in [(c, m) for c in counts for m in args.method or ["default"]]:
            t0 = time.perf_counter()
            rows = run_load(port, method, clients, args.requests, args.max_tokens, prompts, args.temperature)
            wall = time.perf_counter() - t0
            tokens = sum(r["completion_tokens"] for r in rows)
            summary = {
                "clients": clients,
                "method": method,
                "responses": len(rows),
                "complete": sum(r["finish"] in ("stop", "length") for r in rows),
                "latency_seconds": percentiles([r["seconds"] for r in rows]),
                "first_text_seconds": percentiles(
                    [r["first_text_seconds"] for r in rows if r["first_text_seconds"] is not None]
                ),
                "generated_tokens": tokens,
                "wall_seconds": wall,
                "served_tokens_per_second": tokens / wall,
                "decode_seconds_per_request": statistics.median(r["decode_seconds"] for r in rows),
            }
            report["runs"].append(summary)
            name = f"rows-{clients}-{method.replace(':', '_').replace('=', '').replace(',', '_')}.json"
            (out / name).write_text(json.dumps(rows, indent=1))
            (out / "load.json").write_text(json.dumps(report, indent=1))  # kept as it goes
            lat, first = summary["latency_seconds"], summary["first_text_seconds"]
            print(
                f"{clients:2d} clients, {method}: {len(rows)} responses ({summary['complete']} complete) in "
                f"{wall:.1f} s, {summary['served_tokens_per_second']:.1f} tokens/s served; first text p50 "
                f"{first['p50']:.2f} s p99 {first['p99']:.2f} s; latency p50 {lat['p50']:.2f} s p99 {lat['p99']:.2f} s",
                flush=True,
            )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
            (out / "metrics.txt").write_text(resp.read().decode())
        (out / "load.json").write_text(json.dumps(report, indent=1))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    if args.baseline:
        report["transformers"] = baseline(
            counts, args.requests, args.max_tokens, prompts, args.device or "cpu", args.baseline_dtype
        )
        (out / "load.json").write_text(json.dumps(report, indent=1))
    return 0


def baseline(
    counts: list[int], requests: int, max_tokens: int, prompts: list[str], device: str, dtype: str | None = None
) -> list[dict]:
    """transformers as it ships on the default target, for each client count C (module note), each timed after
    one warm-up call."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from multispec.models.default import converted_checkpoint
    from multispec.models.hf import default_dtype

    path = converted_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:  # some transformers versions load this tokenizer without one
        tokenizer.pad_token = tokenizer.eos_token
    if dtype is not None:
        dtype = getattr(torch, dtype)
    else:
        dtype = torch.bfloat16 if device.startswith("cuda") else default_dtype()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()

    def chat(text: str) -> str:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )

    kwargs = dict(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    results = []
    for clients in counts:
        firsts = [chat(prompts[(c * requests) % len(prompts)]) for c in range(clients)]
        batch = tokenizer(firsts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.inference_mode():
            model.generate(**batch, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
            t0 = time.perf_counter()
            model.generate(**batch, **kwargs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            padded = time.perf_counter() - t0
        every = [chat(prompts[i % len(prompts)]) for i in range(clients * requests)]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in every]
        config = GenerationConfig(
            max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=tokenizer.pad_token_id
        )
        model.generate_batch(ids[:1], generation_config=config, max_new_tokens=4)
        t0 = time.perf_counter()
        outputs = model.generate_batch(ids, generation_config=config)
        continuous = time.perf_counter() - t0
        made = sum(len(o.generated_tokens) for o in outputs.values())
        row = {
            "clients": clients,
            "generate_padded_tokens_per_second": clients * max_tokens / padded,
            "generate_batch_tokens_per_second": made / continuous,
            "generate_batch_tokens": made,
            "dtype": str(model.dtype).removeprefix("torch."),
        }
        results.append(row)
        print(
            f"transformers, {clients} clients: generate (padded batch) {row['generate_padded_tokens_per_second']:.1f} "
            f"tokens/s, generate_batch {row['generate_batch_tokens_per_second']:.1f} tokens/s",
            flush=True,
        )
    return results


if __name__ == "__main__":
    sys.exit(main())
