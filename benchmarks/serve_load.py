"""Load on `multispec serve` as a user starts it: the server in a subprocess, C concurrent streaming
`openai` clients x R requests each; latency, time to first text and tokens/s per request, as percentiles.

    python benchmarks/serve_load.py --out benchmarks/results/serve-load-DATE --clients 8 --requests 10 \
        --max-tokens 64 --method sd:gamma=3 --method ar --baseline

`--server-arg` passes an option to `multispec serve` (`--server-arg=--batch-rows=1`: one request at a time).
`--baseline`: after the server has stopped (never two torch jobs at once), transformers' own `generate` as it
ships, over the clients' first prompts in one padded batch (greedy, the same chat template, `max_tokens` new
tokens each, the default target in the server's dtype): the aggregate tokens/s to compare the server's with.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_load(port: int, method: str, clients: int, requests: int, max_tokens: int) -> list[dict]:
    rows: list[dict] = []
    lock = threading.Lock()

    def client_loop(c: int):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=900)
        for r in range(requests):
            t0 = time.perf_counter()
            first = None
            stream = client.chat.completions.create(
                model="multispec",
                messages=[{"role": "user", "content": PROMPTS[(c + r) % len(PROMPTS)]}],
                max_tokens=max_tokens,
                seed=1000 * c + r,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"method": method},
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
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--method", action="append", default=None)
    ap.add_argument("--server-arg", action="append", default=[], help="an option for `multispec serve`")
    ap.add_argument("--baseline", action="store_true", help="also time transformers' batched generate")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
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
            str(args.clients),
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
            "clients": args.clients,
            "requests": args.requests,
            "max_tokens": args.max_tokens,
            "server_args": args.server_arg,
            "methods": {},
        }
        for method in args.method or ["sd:gamma=3"]:
            t0 = time.perf_counter()
            rows = run_load(port, method, args.clients, args.requests, args.max_tokens)
            wall = time.perf_counter() - t0
            tokens = sum(r["completion_tokens"] for r in rows)
            summary = {
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
            report["methods"][method] = summary
            (out / f"rows-{method.replace(':', '_').replace('=', '')}.json").write_text(json.dumps(rows, indent=1))
            lat = summary["latency_seconds"]
            print(
                f"{method}: {len(rows)} responses ({summary['complete']} complete) in {wall:.1f} s, "
                f"{summary['served_tokens_per_second']:.1f} tokens/s served; latency p50 {lat['p50']:.2f} s, "
                f"p90 {lat['p90']:.2f} s, p99 {lat['p99']:.2f} s"
            )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
            (out / "metrics.txt").write_text(resp.read().decode())
        (out / "load.json").write_text(json.dumps(report, indent=1))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    if args.baseline:
        report["transformers_batched_generate"] = baseline(args.clients, args.max_tokens)
        (out / "load.json").write_text(json.dumps(report, indent=1))
    return 0


def baseline(clients: int, max_tokens: int) -> dict:
    """transformers' `generate` as it ships on the default target: the clients' first prompts in one left-padded
    batch, greedy, `max_tokens` new tokens each (no early stop), timed after one warm-up call."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multispec.models.default import converted_checkpoint
    from multispec.models.hf import default_dtype

    path = converted_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=default_dtype()).eval()
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in (PROMPTS * clients)[:clients]
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    with torch.inference_mode():
        model.generate(**batch, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})
        t0 = time.perf_counter()
        model.generate(**batch, **kwargs)
        seconds = time.perf_counter() - t0
    result = {
        "rows": clients,
        "new_tokens": clients * max_tokens,
        "seconds": seconds,
        "tokens_per_second": clients * max_tokens / seconds,
        "dtype": str(model.dtype).removeprefix("torch."),
    }
    print(f"transformers generate, {clients} prompts in one batch: {result['tokens_per_second']:.1f} tokens/s")
    return result


if __name__ == "__main__":
    sys.exit(main())
