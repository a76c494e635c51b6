"""T(k, c): the seconds of one forward over k new tokens after c cached ones, for the default pair, beside
the memory bound (the weights' bytes over the measured read bandwidth) and the compute floor (k tokens times two
operations per weight, over the throughput of a large matrix product in the dtype, measured here): no step over
k tokens can take less than the larger of the two, so the floor of T(k)/T(1) is max(1, compute(k) / memory).

Engines: `dynamic` (transformers' DynamicCache and its own attention, eager: the engine before the static
cache), `static` (our static cache, eager), `compiled` (static cache, torch inductor; on a CPU frozen
weights, each shape in the kernel variant whose step ran fastest here: `multispec.models.hf.KERNELS`),
`invariant` (the batch-invariant compiled step, `compile="invariant"`) and, on
a CUDA device, `graphs` (static cache, eager step captured as a CUDA graph and replayed) and `compiled-graphs`.
Each (engine, dtype) loads its own copy of the models; times are medians of interleaved rounds. One JSON line
per (model, engine, dtype, c, k) goes to --out.

    python benchmarks/cost_curve.py --out benchmarks/results/<run>/cost_curve.jsonl
    python benchmarks/cost_curve.py --device cuda --engines static,graphs --out curve.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def read_bandwidth(gib: float = 1.0, repeats: int = 7, device="cpu") -> float:
    """Bytes per second of a sum over `gib` GiB of float32 (on a CPU, every thread torch uses): the median of
    `repeats` passes (one pass on this kind of host once read 75 GB/s where the rest read 43)."""
    x = torch.ones(int(gib * 2**30) // 4, device=device)
    x.sum()
    rates = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        x.sum()
        sync(device)
        rates.append(x.numel() * 4 / (time.perf_counter() - t0))
    return statistics.median(rates)


def matmul_throughput(dtype: str, size: int = 2048, repeats: int = 5, device="cpu") -> float:
    """Operations per second of a large square matrix product in `dtype` (the library's best case here)."""
    a = torch.randn(size, size, device=device).to(getattr(torch, dtype))
    b = torch.randn(size, size, device=device).to(getattr(torch, dtype))
    a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * size**3 * repeats / (time.perf_counter() - t0)


def weight_bytes(model) -> int:
    """Bytes one step reads: every parameter but the input embedding table (only rows are read), unless tied."""
    hf = model.model
    embed = hf.get_input_embeddings().weight
    tied = hf.get_output_embeddings() is not None and hf.get_output_embeddings().weight is embed
    return sum(p.numel() * p.element_size() for p in hf.parameters() if tied or p is not embed)


def curve(model, ks, contexts, rounds=5, batch_invariant=True):
    """`batch_invariant`: the steps a target runs; a draft's (False) are the fast ones, as drafting runs them."""
    rows = {}
    gen = torch.Generator().manual_seed(0)
    for c in contexts:
        cache = model.new_cache()
        model.forward(cache, torch.randint(model.vocab_size, (1, c), generator=gen), batch_invariant=batch_invariant)
        times = {k: [] for k in ks}
        for k in ks:  # first call of a shape: a compile or a capture, not timed
            model.forward(
                cache, torch.randint(model.vocab_size, (1, k), generator=gen), batch_invariant=batch_invariant
            )
            model.crop(cache, c)
        for _ in range(rounds):
            for k in ks:
                tokens = torch.randint(model.vocab_size, (1, k), generator=gen)
                sync(model.device)
                t0 = time.perf_counter()
                model.forward(cache, tokens, batch_invariant=batch_invariant)
                sync(model.device)
                times[k].append(time.perf_counter() - t0)
                model.crop(cache, c)
        rows[c] = {k: statistics.median(v) for k, v in times.items()}
    return rows


def main() -> None:
    from multispec.api import load_model
    from multispec.models.default import DRAFT_NAME, TARGET_NAME

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--engines", default="dynamic,static,compiled")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--models", default="target,draft")
    p.add_argument("--ks", default="1,2,4,8,16,32,64")
    p.add_argument("--contexts", default="128,1024")
    p.add_argument("--device", default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--random-target",
        metavar="CONFIG",
        default=None,
        help="time a randomly initialised model of this config.json in place of the target (the same "
        "shapes, so the same time per step, where the weights file is not at hand)",
    )
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    bandwidth = read_bandwidth(device=args.device or "cpu")
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s ({args.device or 'cpu'})", flush=True)
    throughput = {dtype: matmul_throughput(dtype, device=args.device or "cpu") for dtype in args.dtypes.split(",")}
    print("matrix product " + ", ".join(f"{d} {f / 1e9:.0f} GFLOP/s" for d, f in throughput.items()), flush=True)
    with open(args.out, "a") as out:
        for which in args.models.split(","):
            name = {"target": TARGET_NAME, "draft": DRAFT_NAME}[which]
            for dtype in args.dtypes.split(","):
                for engine in args.engines.split(","):
                    compiled = "invariant" if engine == "invariant" else engine in ("compiled", "compiled-graphs")
                    if which == "target" and args.random_target:
                        model = random_model(args.random_target, dtype, args.device, compiled)
                    else:
                        model = load_model(name, dtype=dtype, compile=compiled, device=args.device)
                    if engine == "dynamic":
                        model.static = False
                    model.graphs = model.graphs and engine in ("graphs", "compiled-graphs")
                    bound = weight_bytes(model) / bandwidth
                    element = next(model.model.parameters()).element_size()
                    per_token = 2 * weight_bytes(model) / element / throughput[dtype]  # compute floor, one token
                    t0 = time.perf_counter()
                    if which == "target":
                        model.prepare()  # its kernels, and so its cache's storage, as a target's runner decides them
                    storage = str(model.kv_storage()).removeprefix("torch.") if hasattr(model, "kv_storage") else None
                    rows = curve(model, ks, contexts, batch_invariant=which != "draft")
                    for c, row in rows.items():
                        for k, sec in row.items():
                            line = {
                                "model": which,
                                "engine": engine,
                                "dtype": dtype,
                                "context": c,
                                "k": k,
                                "device": str(model.device),
                                "random_weights": bool(which == "target" and args.random_target),
                                "seconds": sec,
                                "bound_seconds": bound,
                                "bandwidth": bandwidth,
                                "compute_seconds": k * per_token,
                                "flops": throughput[dtype],
                                "compile_seconds": model.compile_seconds,
                                "kv_storage": storage,
                            }
                            out.write(json.dumps(line) + "\n")
                        out.flush()
                        t1 = row[ks[0]]
                        print(
                            f"{which} {engine} {dtype} (cache {storage}) c={c}: "
                            + " ".join(f"T({k})={1000 * s:.1f}ms" for k, s in row.items())
                            + f" | T(1)/bound {t1 / bound:.2f}, T(16)/T(1) "
                            f"{row.get(16, float('nan')) / t1:.2f} (floor {max(1.0, 16 * per_token / bound):.2f})",
                            flush=True,
                        )
                    print(f"  ({time.perf_counter() - t0:.0f} s, compiling {model.compile_seconds:.0f} s)", flush=True)
                    del model


def random_model(config_path: str, dtype: str, device: str | None, compile: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    from multispec.models.hf import HFModel

    config = AutoConfig.from_pretrained(config_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    if device is not None:
        model = model.to(device)
    return HFModel(model, None, name=f"random {config.model_type}", compile=compile)


if __name__ == "__main__":
    main()
