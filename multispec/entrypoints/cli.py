"""Command line: a thin layer over the library. Errors in what the user gave exit with status 2 and a
one-line message. Nothing heavy is imported before the arguments are parsed, so --help is quick."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..params import DEFAULT_METHOD, parse_method, parse_params

DESCRIPTION = (
    "Speculative decoding beyond single-token sampling: generate with any method, check a method's "
    "exactness, benchmark methods, reproduce the theory, train a draft."
)


class DEFAULTS(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default after its help, unless it has none worth showing or the help says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def _sampling_args(p: argparse.ArgumentParser, temperature: float) -> None:
    p.add_argument("--temperature", type=float, default=temperature, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (1: off)")
    p.add_argument("--seed", type=int, default=0, help="same seed, same output (an integer in [0, 2**63))")


DRAFT_HELP = "hub id or path, or a folder holding a feature-level head (EAGLE-3); default: the embedded pair's draft"


def _pair_args(p: argparse.ArgumentParser) -> None:
    """The model pair's options of serve and cost-curve."""
    p.add_argument("--target", default=None, help="hub id or path (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help=DRAFT_HELP)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--compile", action="store_true", help="compiled forwards now (see generate --compile)")
    p.add_argument("--eager", action="store_true", help="eager forwards (see generate --eager)")
    p.add_argument(
        "--invariant", action="store_true", help="batch-invariant compiled forwards (see generate --invariant)"
    )
    p.add_argument("--fast", action="store_true", help="the fast compiled step (see generate --fast)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="multispec", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with one method", formatter_class=DEFAULTS)
    g.add_argument("prompt", nargs="?", default=None, help="the prompt (or give --prompts)")
    g.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help="many prompts, decoded together (continuous batching): a JSONL file (`prompt` or Spec-Bench "
        "`turns` a line) or a shipped set (mt-bench, spec-bench-dev); prints one JSON line per prompt as it ends",
    )
    g.add_argument("--batch", type=int, default=8, help="with --prompts: sequences decoded at once")
    g.add_argument("--limit", type=int, default=None, help="with --prompts: the first N prompts only")
    g.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="with --prompts: append the JSON lines to FILE instead of printing them; prompts already in it are "
        "skipped (an interrupted run goes on where it stopped)",
    )
    g.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help="a method (`multispec methods` lists them), parameters after a colon: sd:gamma=6. Unless "
        "given: speculative sampling that copies from the prompt where it can, drafts with the "
        "draft model elsewhere, and picks each draft length, zero included, from the target's "
        "measured cost and the acceptance so far",
    )
    g.add_argument(
        "--plan",
        default=None,
        metavar="FILE",
        help="use the method and parameters of a plan file written by `multispec tune`",
    )
    g.add_argument("--target", default=None, help="hub id or path (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--draft", default=None, help=DRAFT_HELP)
    g.add_argument("--max-new-tokens", type=int, default=128, help="at most this many new tokens")
    _sampling_args(g, 1.0)
    g.add_argument("--gamma", default=None, help="drafts per target call, or auto (sd)")
    g.add_argument("--width", type=int, default=None, help="beam width (beam)")
    g.add_argument("--deterministic", action="store_true", help="deterministic beam search (beam)")
    g.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="any method parameter")
    g.add_argument("--no-chat", action="store_true", help="feed the prompt raw, without the chat template")
    g.add_argument("--device", default=None, help="torch device for both models (e.g. cuda)")
    g.add_argument("--device-map", default=None, help="spread a hub target over devices (e.g. auto, via accelerate)")
    g.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="weights' type for both models (default: bfloat16 where the hardware has fast bfloat16, else float32)",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        help="compile every forward shape in this process, now (kernel variants timed on this machine), even "
        "where the default runs eagerly; compiling takes minutes per shape the first time on a machine; on a CPU "
        "the compiled steps are kept on disk and later processes load them. Unless --compile or --eager: "
        "compiled where that pays (a CPU with AVX512-BF16 or AMX, in bfloat16) once its steps are made on this "
        "machine, which a background process does after the first run (`multispec cache` shows it)",
    )
    g.add_argument(
        "--eager", action="store_true", help="eager forwards, and no compiling in the background (see --compile)"
    )
    g.add_argument(
        "--invariant",
        action="store_true",
        help="batch-invariant compiled steps (implies --compile) on every machine, so a greedy speculative "
        "method gives greedy ar's tokens in bfloat16 too (plain compiled steps already are where our kernels run "
        "and cost no more; eager forwards are batch-invariant already)",
    )
    g.add_argument(
        "--fast",
        action="store_true",
        help="the fast compiled step (implies --compile; kernels raced per shape) even where batch-invariant steps "
        "would cost no more",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")

    c = sub.add_parser(
        "check", help="test a method's output law against the exact one on small Markov pairs", formatter_class=DEFAULTS
    )
    c.add_argument("--method", default="sd", help="method name, parameters after a colon: sd:gamma=3")
    c.add_argument("--runs", type=int, default=20000, help="generations per pair")
    c.add_argument("--pairs", type=int, default=3, help="random model pairs")
    c.add_argument("--vocab", type=int, default=4)
    c.add_argument("--tokens", type=int, default=3, help="tokens generated per run")
    c.add_argument("--alpha", type=float, default=1e-3, help="family-wise significance level")
    c.add_argument(
        "--models",
        choices=["markov", "history", "features"],
        default="markov",
        help="Markov chains, models whose law depends on the whole prefix (tests masks and caches), or a Markov "
        "target with stand-in hidden states and a feature-level draft head reading them",
    )
    c.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")
    _sampling_args(c, 1.0)
    c.add_argument("--json", action="store_true")
    th = sub.add_parser(
        "theory",
        help="Yin et al.'s theory: the three figures as PNG, exact vs simulated numbers",
        formatter_class=DEFAULTS,
    )
    th.add_argument("--out", default="theory-out", help="folder for the PNG files and theory.json")
    th.add_argument("--runs", type=int, default=1000, help="simulated generations per decoder")
    th.add_argument("--vocab", type=int, default=7)
    th.add_argument("--horizon", type=int, default=50)
    th.add_argument("--batch", default="4,5", help="batch sizes M simulated with batch-sd")
    th.add_argument("--seed", type=int, default=0)
    th.add_argument(
        "--bridge-prompts",
        type=int,
        default=0,
        help="also predict sd's acceptance and block efficiency on a real pair for this many "
        "MT-Bench prompts, and measure it",
    )
    th.add_argument(
        "--prompts-file", default=None, help="prompts for the bridge: a shipped set or a file (default mt-bench)"
    )
    th.add_argument("--target", default=None)
    th.add_argument("--draft", default=None)
    th.add_argument("--gamma", type=int, default=4)
    th.add_argument("--max-new-tokens", type=int, default=64)
    th.add_argument("--temperature", type=float, default=1.0)
    th.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    from .distill_args import add_parser as add_distill

    add_distill(sub)
    b = sub.add_parser(
        "bench",
        help="benchmark methods on prompt sets: tokens/s, speed-up, quality, energy; "
        "writes results.jsonl, summary.json, report.md and plots",
        formatter_class=DEFAULTS,
    )
    b.add_argument(
        "--prompts",
        action="append",
        default=None,
        metavar="FILE",
        help="a shipped prompt set (mt-bench, spec-bench-dev, wmt-ende) or a file: Spec-Bench JSONL, "
        "JSON list of strings, or JSONL with 'prompt' (repeatable; default mt-bench)",
    )
    b.add_argument("--categories", action="append", default=None, metavar="A,B", help="only these categories")
    b.add_argument("--limit", type=int, default=None, help="at most N prompts from each file (after --categories)")
    b.add_argument(
        "--spread",
        action="store_true",
        help="take each file's prompts from its categories in turn, so --limit covers all of them",
    )
    b.add_argument(
        "--method",
        action="append",
        default=None,
        metavar="SPEC",
        help="repeatable, parameters after a colon: --method sd:gamma=4; hf, hf-assisted, hf-lookup "
        "and hf-static are transformers' generate, llama-cpp is llama.cpp on a GGUF of the target "
        "(needs llama-cpp-python) (default: every method at its defaults and the hf peers)",
    )
    b.add_argument(
        "--gguf",
        default=None,
        metavar="FILE",
        help="the GGUF file the llama-cpp peer runs (default: the shipped one, for the default target)",
    )
    b.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="FILE",
        help="add the plan of a file written by `multispec tune` as a method (repeatable)",
    )
    b.add_argument("--baseline", default="ar", help="speed-ups are against this method (added if not listed)")
    b.add_argument("--temperature", action="append", type=float, default=None, help="repeatable (default 0)")
    b.add_argument("--top-k", type=int, default=0)
    b.add_argument("--top-p", type=float, default=1.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    b.add_argument("--target", default=None)
    b.add_argument("--draft", default=None)
    b.add_argument("--device", default=None)
    b.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="weights' type for both models (default: bfloat16 where the hardware has fast bfloat16, else float32)",
    )
    b.add_argument(
        "--compile",
        action="store_true",
        help="compiled forwards for our methods (compiles happen in the warm-up, not in timed rows); unless "
        "--compile or --eager, compiled where that pays here (see generate --compile), compiling in the warm-up "
        "what is not made yet",
    )
    b.add_argument("--eager", action="store_true", help="eager forwards for our methods")
    b.add_argument(
        "--invariant", action="store_true", help="batch-invariant compiled forwards (see generate --invariant)"
    )
    b.add_argument("--fast", action="store_true", help="the fast compiled step (see generate --fast)")
    b.add_argument("--no-chat", action="store_true", help="feed text prompts raw, without the chat template")
    b.add_argument("--out", default="bench-out", help="output folder")
    b.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished rows")
    b.add_argument(
        "--processes",
        type=int,
        default=1,
        help="spread the prompts over N processes with accelerate (one GPU each where there are "
        "several; on a CPU they share the cores, so timings are not comparable with one process)",
    )
    b.add_argument("--force", action="store_true", help="discard an earlier results.jsonl in --out")
    b.add_argument(
        "--batch",
        default=None,
        metavar="N[,N...]",
        help="decode the whole prompt set N sequences at a time (continuous batching), for each N, against "
        "transformers' batched generate (hf): aggregate tokens/s and tokens per target call per method "
        "(default methods: ar, the default, hf); writes batch.jsonl, batch.md, batch.png",
    )
    b.add_argument("--no-warmup", action="store_true")
    b.add_argument(
        "--preset",
        default=None,
        help="smoke: 5 prompts, ar / sd:gamma=4 / hf / hf-assisted, 32 tokens, greedy (a couple of minutes on a CPU)",
    )
    tu = sub.add_parser(
        "tune",
        help="which method and tree for this pair, machine and your prompts: measure "
        "acceptance and forward costs, predict every candidate plan, measure the best, write a "
        "plan file",
        formatter_class=DEFAULTS,
    )
    tu.add_argument(
        "--prompts",
        action="append",
        default=None,
        metavar="FILE",
        help="a shipped set (mt-bench, spec-bench-dev, wmt-ende, ...) or a JSONL/JSON file; repeatable "
        "(default: mt-bench)",
    )
    tu.add_argument("--categories", action="append", default=None, metavar="A,B", help="only these categories")
    tu.add_argument(
        "--skip",
        type=int,
        default=0,
        help="leave out the first N selected prompts (e.g. to tune on one half and measure on the other)",
    )
    tu.add_argument("--limit", type=int, default=10, help="tune on at most N prompts (at least 2)")
    tu.add_argument("--spread", action="store_true", help="take prompts from the categories in turn")
    tu.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    tu.add_argument("--top-k", type=int, default=0)
    tu.add_argument("--top-p", type=float, default=1.0)
    tu.add_argument("--seed", type=int, default=0)
    tu.add_argument("--max-new-tokens", type=int, default=128)
    tu.add_argument(
        "--measure", type=int, default=3, help="measure the N best predicted plans (and the best sd chain, and ar)"
    )
    tu.add_argument("--target", default=None)
    tu.add_argument("--draft", default=None)
    tu.add_argument("--device", default=None)
    tu.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    tu.add_argument("--compile", action="store_true", help="compile forwards (see generate --compile)")
    tu.add_argument("--eager", action="store_true", help="eager forwards (see generate --eager)")
    tu.add_argument(
        "--invariant", action="store_true", help="batch-invariant compiled forwards (see generate --invariant)"
    )
    tu.add_argument("--fast", action="store_true", help="the fast compiled step (see generate --fast)")
    tu.add_argument("--no-chat", action="store_true", help="feed text prompts raw, without the chat template")
    tu.add_argument("--out", default="plan.json", help="the plan file to write")
    tu.add_argument("--json", action="store_true", help="print the plan file's contents instead of the table")
    sv = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (chat, completions, streaming, /metrics) "
        "over one model pair; concurrent requests decode together (--batch-rows)",
        formatter_class=DEFAULTS,
    )
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help="the method of requests that name none (a request's 'method' field overrides it)",
    )
    sv.add_argument("--model-name", default="multispec", help="the model id clients send and /v1/models lists")
    sv.add_argument(
        "--max-queue", type=int, default=16, help="requests that may wait behind the ones running; more get 429"
    )
    sv.add_argument(
        "--batch-rows",
        "--max-batch",
        dest="batch_rows",
        type=int,
        default=8,
        help="requests decoded together, one cache row each (continuous batching; 1: one request at a time)",
    )
    sv.add_argument("--max-tokens", type=int, default=128, help="new tokens of a request that gives no max_tokens")
    sv.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=N",
        help="bound what one request may ask for (repeatable): body_bytes, prompt_tokens, max_tokens, "
        "messages, stop_strings, stop_length, tree_nodes, gamma, max_unchecked, rows, ngram, draft_vocabs (defaults: "
        "`multispec.entrypoints.serve.Limits`)",
    )
    _pair_args(sv)
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])

    cc = sub.add_parser(
        "cost-curve",
        help="measure this device's forward costs T(k, c) for the target and the "
        "draft and write them to a file (to project speeds onto another device)",
        formatter_class=DEFAULTS,
    )
    cc.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write")
    _pair_args(cc)
    cc.add_argument("--repeats", type=int, default=4, help="interleaved rounds per point (the median is kept)")

    rp = sub.add_parser(
        "reproduce",
        help="measure every seed paper's headline claim on one pair: REPORT.md with "
        "paired-bootstrap intervals and verdicts, claims.json and figures",
        formatter_class=DEFAULTS,
    )
    rp.add_argument("--out", default="reproduce-out", help="folder for the report and each experiment's bench run")
    rp.add_argument(
        "--quick",
        action="store_true",
        help="3 prompts per experiment and 32-token outputs (minutes; "
        "wide intervals) instead of the full run (over an hour on a 2-core CPU)",
    )
    rp.add_argument(
        "--claims",
        action="append",
        default=None,
        metavar="NAMES",
        help="only these claims: papers (mtad, mjsd, theory, dsbd, mcsd) or claim ids, comma-separated; "
        "repeatable (default: all)",
    )
    rp.add_argument("--resume", action="store_true", help="continue a report in --out (finished work is kept)")
    rp.add_argument("--force", action="store_true", help="start again, removing an earlier report's runs in --out")
    rp.add_argument(
        "--device-curve",
        default=None,
        metavar="FILE",
        help="a `multispec cost-curve` file of another device: adds a section projecting each method's "
        "speed-up there from the block efficiencies measured here (a projection, not a measurement)",
    )
    _pair_args(rp)

    cp = sub.add_parser(
        "cache",
        aliases=["compiled"],
        help="what this machine's cache holds (converted models, compiled steps, measurements, background "
        "compiles), or remove it",
        formatter_class=DEFAULTS,
    )
    cp.add_argument(
        "--clear",
        action="store_true",
        help="remove it all: compiled steps, measurements and converted models (remade when next needed), and stop "
        "any background compile; with --compiled, --model or --stale only those compiled steps",
    )
    cp.add_argument("--compiled", action="store_true", help="only the compiled steps")
    cp.add_argument("--model", default=None, help="only the compiled steps of models whose name contains this")
    cp.add_argument(
        "--stale",
        action="store_true",
        help="only the compiled steps of another compiled graph than this version's (listed as stale; they are "
        "never loaded again, and the next compile removes them)",
    )

    pc = sub.add_parser(
        "compile",
        help="make the pair's compiled steps on this machine now, every shape (what the first runs otherwise leave "
        "to a background process), so that later runs load them",
        formatter_class=DEFAULTS,
    )
    pc.add_argument("--target", default=None, help="hub id or path (default: the embedded SmolLM2-135M-Instruct)")
    pc.add_argument("--draft", default=None, help="hub id or path (default: the embedded pair's draft)")
    pc.add_argument("--device", default=None)
    pc.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    pc.add_argument("--only", default=None, choices=["target", "draft"], help="one model of the pair")
    pc.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        metavar="N",
        help="the draft cut to its N most frequent tokens (what `draft_vocab=N` runs) instead of the whole draft",
    )
    pc.add_argument(
        "--background",
        action="store_true",
        help="run as the background worker: at a lower priority, progress in its status file (`multispec cache`)",
    )

    m = sub.add_parser("methods", help="list every method with its parameters, defaults and exactness")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _compile(args) -> bool | str:
    """What `load_pair` takes for --compile, --eager, --invariant and --fast (eager forwards are batch-invariant
    already); "auto" when none is given."""
    invariant, fast = getattr(args, "invariant", False), getattr(args, "fast", False)
    eager = getattr(args, "eager", False)
    if invariant and fast:
        raise SystemExit("multispec: --invariant and --fast ask for opposite compiled steps: give one")
    if eager and (args.compile or invariant or fast):
        raise SystemExit("multispec: --eager and --compile (--invariant, --fast) ask for opposite forwards: give one")
    if eager:
        return False
    if invariant or fast:
        return "invariant" if invariant else "fast"
    if args.compile:
        return True
    return "auto"


def _measured_pair(args, device):
    """`load_pair` for the commands that measure (bench, tune, reproduce, cost-curve): with no flag, what is not
    compiled yet is compiled in this process, before anything is timed, not in a worker beside the measurement."""
    from ..api import load_pair
    from ..models.hf import background

    compile = _compile(args)
    with background.foreground():
        return load_pair(args.target, args.draft, device=device, dtype=args.dtype, compile=compile)


def cmd_methods(args) -> int:
    from ..decoding import METHODS

    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "exact": m.exact,
                        "summary": m.summary,
                        "draft": m.draft_use(m.resolve({})),
                        "params": {
                            k: {"default": p.default, "values": p.rule, "help": p.help} for k, p in m.params.items()
                        },
                    }
                    for name, m in METHODS.items()
                }
            )
        )
        return 0
    print(f"Default (generate() and `multispec generate` without a method): {DEFAULT_METHOD}\n")
    for name, m in METHODS.items():
        draft = {"required": "needs a draft model", "none": "no draft model"}.get(m.draft_use(m.resolve({})), "")
        print(
            f"{name}: {m.summary}\n  exact: {m.exact}"
            + (f"; {draft} at its defaults" if m.needs_draft else "; no draft model")
        )
        for key, p in m.params.items():
            print(f"  {key} = {p.default!r}  ({p.rule}){': ' + p.help if p.help else ''}")
    print("\nParameters go after a colon (sd:gamma=2,drafter=lookup) or in --param KEY=VALUE.")
    return 0


def cmd_bench(args) -> int:
    from ..tools import bench

    preset = bench.PRESETS.get(args.preset, {}) if args.preset else {}
    if args.preset and not preset:
        raise ValueError(f"unknown preset {args.preset!r}; presets: {', '.join(bench.PRESETS)}")
    categories = [c.strip() for item in args.categories or [] for c in item.split(",") if c.strip()] or None
    # everything that needs no model is checked before the models load
    if args.prompts or not args.preset:
        prompts = bench.load_prompts(args.prompts or ["mt-bench"], categories, args.limit, args.spread)
    else:
        prompts = bench.select_prompts([bench.preset_prompts(args.preset)], categories, args.limit, args.spread)
    temperatures = args.temperature or preset.get("temperatures", [0.0])
    max_new = args.max_new_tokens if args.max_new_tokens is not None else preset.get("max_new_tokens", 128)
    methods = (
        args.method
        or preset.get("methods")
        or ([] if args.plan else bench.default_methods(with_draft=args.draft is not None or args.target is None))
    )
    from ..tools.tune import load_plan

    plans = [load_plan(f) for f in args.plan]
    methods = [*methods, *(p.spec for p in plans)]
    bench.plan(methods, args.baseline)
    bench.check_settings(temperatures, max_new, args.top_k, args.top_p)
    from ..tools.bench import llamacpp, sweep

    if args.gguf is not None:
        llamacpp.gguf_for(None, args.gguf)  # a missing file is named before the models load

    if args.processes < 1:
        raise ValueError(f"--processes must be at least 1, got {args.processes}")
    if args.batch is not None:
        return _bench_batched(args, prompts, temperatures, max_new, methods)
    if args.processes > 1 and sweep.launched():
        raise ValueError("--processes is for a plain run; under accelerate launch, give --num_processes to it")
    state = sweep.process_state() if sweep.launched() else None
    main_process = state is None or state.is_main_process
    bench.prepare_out(args.out, args.resume, args.force, delete=False)
    if args.processes > 1:
        print(f"bench: {len(prompts)} prompts over {args.processes} processes (accelerate launch)", file=sys.stderr)
        return sweep.launch(sweep.without_processes(args.argv), args.processes)

    device = args.device or (sweep.process_device(state) if state is not None else None)
    pair = _measured_pair(args, device)
    if main_process:
        from ..tools.tune import plan_mismatches

        for path, p in zip(args.plan, plans, strict=True):
            for line in plan_mismatches(p, pair.description):
                print(f"multispec: note: {path}: {line}", file=sys.stderr)
        print(
            f"bench: {len(prompts)} prompts x {len(methods)} methods x {len(temperatures)} temperatures on "
            f"{' / '.join(pair.description)} -> {args.out}"
            + (f" ({state.num_processes} processes)" if state is not None else ""),
            file=sys.stderr,
        )
    summary = bench.run_bench(
        pair.target,
        pair.draft,
        prompts,
        methods,
        args.out,
        **_run_settings(args, temperatures, max_new),
        models=pair.description,
        state=state,
        gguf=args.gguf,
    )
    if summary is None:  # a sweep's other processes: the main one reports
        return 0
    base = summary["meta"]["baseline"]
    for t, data in summary["temperatures"].items():
        print(f"temperature {float(t):g}:")
        for name, s in data["methods"].items():
            tps = s["tokens_per_second"]["median"] if s["tokens_per_second"] else float("nan")
            up = s["speedup"]["median"] if s["speedup"] else float("nan")
            print(f"  {name:24s} {tps:7.1f} tokens/s  {up:5.2f}x {base}  ({s['prompts']} ok, {s['errors']} errors)")
    print(f"wrote {args.out}/report.md, summary.json, results.jsonl, speedup.png, quality_speed.png")
    return 0


def _run_settings(args, temperatures, max_new) -> dict:
    """The run settings `run_bench` and `run_batched` both take, from bench's arguments."""
    return dict(
        temperatures=temperatures,
        max_new_tokens=max_new,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        chat=not args.no_chat,
        baseline=args.baseline,
        resume=args.resume,
        force=args.force,
        warmup=not args.no_warmup,
    )


def _bench_batched(args, prompts, temperatures, max_new, methods) -> int:
    from ..params import DEFAULT_METHOD
    from ..tools.bench.batched import run_batched

    try:
        rows = [int(n) for n in args.batch.split(",") if n.strip()]
    except ValueError:
        raise ValueError(f"--batch takes row counts such as 8 or 1,2,4,8, got {args.batch!r}") from None
    if args.processes != 1:
        raise ValueError("--batch runs in one process: leave out --processes")
    methods = args.method or ["ar", DEFAULT_METHOD, "hf"]
    pair = _measured_pair(args, args.device)
    print(
        f"bench: {len(prompts)} prompts x {len(methods)} methods x {len(temperatures)} temperatures, "
        f"{args.batch} at a time, on {' / '.join(pair.description)} -> {args.out}",
        file=sys.stderr,
    )
    run_batched(
        pair.target,
        pair.draft,
        prompts,
        methods,
        args.out,
        rows,
        **_run_settings(args, temperatures, max_new),
    )
    print(f"wrote {args.out}/batch.md, batch.jsonl, batch.png")
    return 0


def cmd_theory(args) -> int:
    from pathlib import Path

    from ..tools.theory import figures

    if args.runs < 2 or args.vocab < 2 or args.horizon < 1:
        raise ValueError("--runs must be >= 2, --vocab >= 2 and --horizon >= 1")
    try:
        batch = [int(m) for m in args.batch.split(",") if m.strip()]
    except ValueError:
        raise ValueError(f"--batch takes comma-separated integers, got {args.batch!r}") from None
    if any(m < 1 for m in batch):
        raise ValueError(f"batch sizes must be >= 1, got {args.batch!r}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    say = (lambda m: None) if args.json else (lambda m: print(f"  {m}", file=sys.stderr))
    data = figures.compute(args.vocab, args.horizon, args.runs, tuple(batch), args.seed, progress=say)
    if args.bridge_prompts > 0:
        data["bridge"] = _bridge(args, say)
    paths = figures.plot(data, out)
    if args.json:
        slim = {k: v for k, v in data.items()}
        slim["fig_a"] = {k: {kk: vv for kk, vv in d.items() if kk != "running_mean"} for k, d in data["fig_a"].items()}
        print(json.dumps(slim))
        return 0
    print(f"Random non-stationary chains: V={args.vocab}, T={args.horizon}, {args.runs} simulated runs each")
    for name, d in data["fig_a"].items():
        print(
            f"  {name:14s} exact E[N_rej] = {d['exact']:.3f}   simulated {d['simulated_mean']:.3f} "
            f"± {d['simulated_se']:.3f} (1 s.e.)"
        )
    sd = data["fig_a"]["sd"]
    print(
        f"  acceleration T/E[N_rej] = {sd['acceleration_exact']:.2f}; expected target calls {sd['expected_calls']:.2f}"
    )
    b = data["fig_b"]
    print(
        f"  batch SD: M=1 {b['expected_rejections'][0]:.3f}, M=10 {b['expected_rejections'][9]:.3f}, "
        f"M=50 {b['expected_rejections'][-1]:.3f}, M=inf {b['limit']:.3f}"
    )
    print(f"One step, TV = {data['fig_c']['tv']:.3f}: sd-opt measured (rejection, bias) vs exact:")
    for m in data["fig_c"]["measured"]:
        print(
            f"  eps={m['eps']:<5} {m['resample']}: ({m['rejection']:.3f}, {m['bias']:.3f}) "
            f"exact ({m['exact_rejection']:.3f}, {m['exact_bias']:.3f})"
        )
    if "bridge" in data:
        br = data["bridge"]
        print(
            f"Bridge on {br['prompts']} prompts (gamma {args.gamma}): mean TV {br['mean_tv']:.3f}; acceptance "
            f"predicted {br['predicted_acceptance']:.3f} / measured {br['measured_acceptance']:.3f}; "
            f"block efficiency predicted {br['predicted_tau_positional']:.2f} (positional), "
            f"{br['predicted_tau_iid']:.2f} (i.i.d.) / measured {br['measured_tau']:.2f}"
        )
    for p in paths:
        print(f"wrote {p}")
    return 0


def _bridge(args, say) -> dict:
    from ..api import load_pair
    from ..tools.bench.prompts import load_prompt_file
    from ..tools.theory.bridge import predict_and_measure, summarise
    from ..warp import Sampling

    prompts = [p.text for p in load_prompt_file(args.prompts_file or "mt-bench")]
    prompts = prompts[: args.bridge_prompts]
    pair = load_pair(args.target, args.draft)
    say(f"bridge: {len(prompts)} prompts on {' / '.join(pair.description)}")
    rows = predict_and_measure(
        pair.target,
        pair.draft,
        prompts,
        gamma=args.gamma,
        max_new_tokens=args.max_new_tokens,
        sampling=Sampling(args.temperature),
    )
    out = summarise(rows)
    out["pair"] = pair.description
    out["gamma"] = args.gamma
    return out


def _batch_prompts(args) -> list:
    """The prompts of `--prompts` still to decode: those not in `--out` already."""
    from ..batching import MAX_BATCH
    from ..tools.bench.prompts import load_prompt_file

    if isinstance(args.batch, bool) or not 1 <= args.batch <= MAX_BATCH:
        raise ValueError(f"--batch must be from 1 to {MAX_BATCH}, got {args.batch}")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    prompts = load_prompt_file(args.prompts, limit=args.limit)
    done = set()
    if args.out is not None and Path(args.out).is_file():
        for number, line in enumerate(Path(args.out).read_text(encoding="utf-8").splitlines(), 1):
            try:
                done.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{args.out}, line {number}: not a line of `multispec generate --prompts`") from None
    return [p for p in prompts if p.id not in done]


def _generate_many(args, pair, prompts: list, name: str, params: dict) -> int:
    """`generate --prompts`: every prompt through `generate_batch`, a JSON line each as it ends."""
    import threading
    import time

    from ..batching import generate_batch

    if not prompts:
        print("multispec: every prompt is in --out already", file=sys.stderr)
        return 0
    out = open(args.out, "a", encoding="utf-8") if args.out is not None else sys.stdout  # noqa: SIM115
    lock = threading.Lock()
    tokens = 0

    def write(i: int, result) -> None:
        nonlocal tokens
        line = {
            "id": prompts[i].id,
            "text": result.text,
            "token_ids": result.token_ids,
            "stats": result.stats.as_dict(),
        }
        with lock:
            tokens += len(result.token_ids)
            out.write(json.dumps(line) + "\n")
            out.flush()

    start = time.perf_counter()
    try:
        generate_batch(
            pair.target,
            pair.draft,
            [p.text for p in prompts],
            name,
            seed=args.seed,
            rows=min(args.batch, len(prompts)),
            on_result=write,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            chat=not args.no_chat,
            **params,
        )
    finally:
        if out is not sys.stdout:
            out.close()
    seconds = time.perf_counter() - start
    print(
        f"multispec: {len(prompts)} prompts, {tokens} tokens in {seconds:.1f} s: {tokens / seconds:.1f} tokens/s "
        f"in all, {min(args.batch, len(prompts))} at once",
        file=sys.stderr,
    )
    return 0


def cmd_generate(args) -> int:
    from ..api import ModelPair, describe_model, generate, load_model, load_pair, validate_request

    spec = args.method
    if args.plan:
        from ..tools.tune import load_plan

        if args.method != DEFAULT_METHOD:
            raise ValueError("give --method or --plan, not both")
        plan = load_plan(args.plan)
        spec = plan.spec
        tuned = plan.data.get("settings", {}).get("temperature")
        if tuned is not None and float(tuned) != args.temperature:
            print(
                f"multispec: note: the plan was tuned at temperature {tuned:g}, this run uses {args.temperature:g}",
                file=sys.stderr,
            )
    name, params = parse_method(spec)
    params.update(parse_params(args.param))
    for key in ("gamma", "width"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    if args.deterministic:
        params["deterministic"] = True
    # check what needs no model before spending seconds on loading one
    method, _, _ = validate_request(
        name, args.max_new_tokens, args.temperature, args.top_k, args.top_p, params, args.seed
    )
    if method.markov_only:
        raise ValueError(
            f"method {name!r} runs only on MarkovLM test models (library use); the command line loads real models"
        )
    if (args.prompt is None) == (args.prompts is None):
        raise ValueError("give a prompt or --prompts FILE (one of them)")
    if args.prompts is None and not args.prompt.strip():
        raise ValueError("the prompt is empty")
    todo = _batch_prompts(args) if args.prompts is not None else None
    if method.draft_use(method.resolve(params)) != "none":
        pair = load_pair(
            args.target,
            args.draft,
            device=args.device,
            dtype=args.dtype,
            device_map=args.device_map,
            compile=_compile(args),
        )
    else:  # target-only methods: do not spend time loading a draft
        target_only = load_model(
            args.target, args.device, dtype=args.dtype, device_map=args.device_map, compile=_compile(args)
        )
        pair = ModelPair(target_only, None, {target_only.name: describe_model(target_only)})
    if args.plan:
        from ..tools.tune import plan_mismatches

        for line in plan_mismatches(plan, pair.description):
            print(f"multispec: note: {line}", file=sys.stderr)
    target = pair.target
    if todo is not None:
        return _generate_many(args, pair, todo, name, params)
    from .. import console
    from ..streaming import TextStream

    text = TextStream(target.decode)

    def stream(tokens: list[int]) -> None:
        console.write(text.push(tokens))

    result = generate(
        target,
        pair.draft,
        args.prompt,
        method=name,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        chat=not args.no_chat,
        on_tokens=None if args.json else stream,
        **params,
    )
    st = result.stats
    if args.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "token_ids": result.token_ids,
                    "stats": st.as_dict(),
                    "method": name,
                    "models": pair.description,
                }
            )
        )
        return 0
    console.write(text.finish())
    console.end_text()  # the summary below ends the line
    acc = f" · acceptance {st['acceptance_rate']:.2f}" if st["acceptance_rate"] is not None else ""
    predicted = (
        f" · decoding {st['decode_tokens_per_second']:.1f} tokens/s, predicted {st['predicted_tokens_per_second']:.1f}"
        if st.get("predicted_tokens_per_second")
        else ""
    )
    ppl = f" · perplexity {st['perplexity']:.2f}" if st.get("perplexity") is not None else ""
    once = (
        f" · one-time setup {st['one_time_seconds']:.1f} s (compiling, cost calibration; not counted)"
        if st.get("one_time_seconds")
        else ""
    )
    split = (
        f" · time: target {st['target_seconds']:.2f} s, draft {st['draft_seconds']:.2f} s, "
        f"other {st['other_seconds']:.2f} s"
    )
    print(
        f"\n[{name}] {st['new_tokens']} tokens in {st['seconds']:.2f} s ({st['tokens_per_second']:.1f} tokens/s)"
        f" · target calls {st['target_calls']} · block efficiency {st['block_efficiency']:.2f}{acc}{predicted}"
        f"{ppl} · stopped: {st['stopped']}{split}{once}"
    )
    # described now: a compiled target's steps may have become batch-invariant at its first step
    models = " / ".join(
        f"{role}: {describe_model(m)}" for role, m in (("target", pair.target), ("draft", pair.draft)) if m is not None
    )
    print(f"[models] {models}", file=sys.stderr)
    return 0


def cmd_serve(args) -> int:
    from .serve import Limits, Server, serve

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    limits = Limits.parse(args.limit)
    name, params = parse_method(args.method)
    from ..api import load_pair
    from ..decoding import get_method

    get_method(name).resolve(params)  # a bad default method fails before the models load
    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype, compile=_compile(args))
    server = Server(
        pair,
        model_name=args.model_name,
        method=args.method,
        max_queue=args.max_queue,
        max_tokens=args.max_tokens,
        limits=limits,
        batch_rows=args.batch_rows,
        driven=True,  # the models' work on this (the main) thread, HTTP on another: `serve`
    )  # every option checked before the port is taken
    print(
        f"multispec: serving {' / '.join(pair.description)} as {args.model_name!r} on "
        f"http://{args.host}:{args.port}/v1 (default method {args.method}; "
        + (f"up to {server.rows} requests decoding together)" if server.rows > 1 else "one request at a time)"),
        file=sys.stderr,
    )
    return serve(server, host=args.host, port=args.port, log_level=args.log_level)


def cmd_cost_curve(args) -> int:
    from pathlib import Path

    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file name (e.g. {out / 'cost-curve.json'})")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    from ..models.cost import write_cost_curves

    pair = _measured_pair(args, args.device)
    data = write_cost_curves(out, {"target": pair.target, "draft": pair.draft}, repeats=args.repeats)
    print(f"{data['device']}, {data['date']}, host {data['host']}")
    for role, c in data["models"].items():
        row = c["seconds"][0]
        shown = [(k, row[j]) for j, k in enumerate(c["tokens"]) if k in (1, 2, 4, 8, 16, 32, 65)]
        print(
            f"  {role:6s} {c['name']} ({c['dtype']}, {c['engine']}) after {c['contexts'][0]} tokens: "
            + ", ".join(f"T({k}) {t * 1e3:.1f} ms" for k, t in shown)
        )
    print(f"wrote {out}")
    return 0


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def cmd_cache(args) -> int:
    import shutil
    import time as _time

    from ..machine import cache_dir, kernel_store_path, store_path
    from ..models import packaged
    from ..models.hf import background

    # `multispec compiled`, the older name, lists and clears the compiled steps only
    compiled_only = args.command == "compiled" or args.compiled or args.model is not None or args.stale
    found = [
        p
        for p in packaged.packages()
        if (args.model is None or args.model in p["model"]) and (p["stale"] or not args.stale)
    ]
    root = cache_dir()
    if args.clear:
        stopped = [] if compiled_only else background.stop_workers()
        for p in found:
            packaged.remove(p["path"])
        line = f"removed {len(found)} compiled step(s), {sum(p['bytes'] for p in found) / 1e6:.0f} MB"
        if not compiled_only:
            removed = 0
            others = [kernel_store_path(), store_path(), background.folder()]
            others += [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
            for path in dict.fromkeys(others):
                if path.exists():
                    removed += _size(path)
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
            line += f", and {removed / 1e6:.0f} MB of measurements and converted models"
            if stopped:
                line += f"; stopped the background compile (process {', '.join(map(str, stopped))})"
        print(line + f" from {root}")
        return 0
    if not compiled_only:
        print(f"{root}: {_size(root) / 1e6:.0f} MB" if root.exists() else f"{root}: empty")
        for path in sorted(root.iterdir()) if root.is_dir() else []:
            if path.is_dir() and path not in (packaged.folder(), background.folder()):
                print(f"  converted model  {path.name}  {_size(path) / 1e6:.0f} MB")
        for path in dict.fromkeys((store_path(), kernel_store_path())):
            if path.exists():
                print(f"  measurements  {path.name}  {_size(path) / 1e3:.0f} kB")
        for w in background.workers():
            state = w.get("state", "?")
            if state in ("queued", "compiling") and not w["alive"]:
                state = "stopped"
            shape = f", {w['shape']}" if w.get("shape") and state == "compiling" else ""
            error = f": {w['error']}" if w.get("error") else ""
            print(
                f"  background compile  {w.get('model', '?')} ({w.get('role', '?')})  {state}  "
                f"{w.get('done', 0)} of {w.get('total', len(background.BUCKETS))} shapes{shape}{error}"
                + (f"  (log: {Path(w['path']).with_suffix('.log')})" if state in ("failed", "stopped") else "")
            )
    print(
        f"{packaged.folder()}: {len(found)} compiled step(s), {sum(p['bytes'] for p in found) / 1e6:.0f} MB "
        f"(limit {packaged.limit_bytes() / 1e9:g} GB, {packaged.LIMIT_VARIABLE}; the least recently used go first)"
    )
    for p in found:
        fields = dict(f.split("=", 1) for f in p["key"].split("|") if "=" in f)
        dtype = next((f for f in p["key"].split("|") if f.startswith("torch.")), "")
        used = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(p["used"]))
        print(
            f"  {p['model']}  {dtype}  {p['path'].stem}  {p['bytes'] / 1e6:.0f} MB  used {used}  "
            f"weights {fields.get('weights', '?')[:8]}  {p['path'].parent.name}" + ("  stale" if p["stale"] else "")
        )
    return 0


def cmd_compile(args) -> int:
    from ..models.hf import background

    roles = [args.only] if args.only else ["target", "draft"]
    if args.draft_vocab is not None and args.draft_vocab < 1:
        raise ValueError(f"--draft-vocab {args.draft_vocab}: a number of tokens, at least 1")
    if args.draft is None and args.target is not None and args.only != "draft":
        roles = ["target"]  # a hub target has no default draft
    if args.background:
        os.nice(10)  # a worker yields the cores to what the user runs
    try:
        _compile_models(args, roles)
    except BaseException as e:
        if args.background:  # what `multispec cache` shows of it
            for role in roles:
                name = (args.target if role == "target" else args.draft) or ""
                name = background.source_key(name, args.draft_vocab if role == "draft" else None)
                path = background.status_path(name, role, f"torch.{args.dtype}", args.device)
                if path.exists():
                    background.write_status(path, state="failed", error=f"{type(e).__name__}: {e}"[:500])
        raise
    return 0


def _compile_models(args, roles: list[str]) -> None:
    from ..api import load_model
    from ..models.default import DRAFT_NAME
    from ..models.hf import background
    from ..models.vocab import reduce_vocab
    from ..tools.prepare import run

    with background.compile_lock("multispec: another process is compiling on this machine; waiting for it ..."):
        models = []
        for role in roles:
            name = args.target if role == "target" else args.draft
            extra = {"default": DRAFT_NAME} if role == "draft" else {}
            model = load_model(name, args.device, dtype=args.dtype, compile=True, role=role, **extra)
            if role == "draft" and args.draft_vocab is not None:
                model = reduce_vocab(model, args.draft_vocab).scorer
            if not getattr(model, "compile", False):
                print(f"multispec: {model.name} cannot be compiled (a dynamic cache)", file=sys.stderr)
                continue
            models.append((model, role))
        run(models, in_background=args.background)


def cmd_reproduce(args) -> int:
    from ..tools.reproduce import reproduce, select
    from ..tools.reproduce.report import verdict_table

    claims = [c.strip() for item in args.claims or [] for c in item.split(",") if c.strip()] or None
    select(claims)  # unknown names fail before the models load
    if args.device_curve is not None:
        from ..models.cost import read_cost_curves

        read_cost_curves(args.device_curve)

    pair = _measured_pair(args, args.device)
    data = reproduce(
        pair.target,
        pair.draft,
        args.out,
        quick=args.quick,
        claims=claims,
        resume=args.resume,
        force=args.force,
        device_curve=args.device_curve,
        models=pair.description,
        command="multispec " + " ".join(args.argv),
    )
    print("\n".join(verdict_table(data)))
    print(f"\nwrote {args.out}/REPORT.md, {args.out}/claims.json and the figures")
    return 0


def cmd_tune(args) -> int:
    from ..tools import bench
    from ..tools.tune import table, tune, write_plan

    categories = [c.strip() for item in args.categories or [] for c in item.split(",") if c.strip()] or None
    if args.skip < 0 or args.limit < 2:
        raise ValueError(f"--skip must be >= 0 and --limit >= 2, got {args.skip} and {args.limit}")
    prompts = bench.load_prompts(args.prompts or ["mt-bench"], categories, None, args.spread)
    prompts = prompts[args.skip : args.skip + args.limit]
    if len(prompts) < 2:
        raise ValueError(f"tune needs at least 2 prompts; the selection after --skip {args.skip} has {len(prompts)}")
    bench.check_settings([args.temperature], args.max_new_tokens, args.top_k, args.top_p)

    pair = _measured_pair(args, args.device)
    if pair.draft is None:
        raise ValueError("tune needs a draft model (--draft)")

    def say(message: str) -> None:
        print("tune: " + message, file=sys.stderr)

    say(
        f"{len(prompts)} prompts on {' / '.join(pair.description)}, temperature {args.temperature:g}, "
        f"{args.max_new_tokens} tokens"
    )
    result = tune(
        pair.target,
        pair.draft,
        prompts,
        args.temperature,
        args.top_k,
        args.top_p,
        args.max_new_tokens,
        args.seed,
        not args.no_chat,
        args.measure,
        say,
    )
    path = write_plan(result, args.out, pair.description)
    if args.json:
        print(path.read_text())
        return 0
    print(table(result))
    c = result.chosen
    print(
        f"\nplan: {c.label}"
        + (f" ({c.tree.describe()})" if c.tree is not None and c.tree.size else "")
        + f": measured {c.measured_tokens_per_second:.1f} tokens/s, predicted "
        f"{c.predicted_tokens_per_second:.1f} ({c.seconds * 1e3:.2f} ms an iteration for {c.tokens:.2f} tokens, "
        f"and {c.prefill:.2f} s of prompt forwards over {c.new_tokens:.0f} expected new tokens)"
    )
    print(f'wrote {path}; use it with: multispec generate --plan {path} "PROMPT"  or  multispec bench --plan {path}')
    return 0


def cmd_check(args) -> int:
    from ..decoding import get_method
    from ..tools.check import check_method

    name, params = parse_method(args.method)
    params.update(parse_params(args.param))
    get_method(name).resolve(params)  # reject bad parameters before the long run
    report = check_method(
        name,
        runs=args.runs,
        pairs=args.pairs,
        vocab=args.vocab,
        n_tokens=args.tokens,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        alpha=args.alpha,
        models=args.models,
        progress=not args.json and sys.stderr.isatty(),
        **params,
    )
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(
            f"method {name} {params or ''}: {args.runs} runs x {args.pairs} random model pairs, "
            f"V={args.vocab}, {args.tokens} tokens each ({args.models} models), against the exact law of target "
            "sampling"
        )
        for p in report.pairs:
            print(
                f"  pair seed {p.seed}: chi2 = {p.chi2:.2f} (dof {p.dof}), p-value = {p.p_value:.4g}, "
                f"TV(empirical, exact) = {p.tv:.4f}"
            )
        verdict = "PASS" if report.passed else "FAIL"
        print(
            f"{verdict}: every p-value >= {args.alpha}/{args.pairs}"
            if report.passed
            else f"{verdict}: some p-value < {args.alpha}/{args.pairs}"
        )
    return 0 if report.passed else 1


COMMANDS = {
    "methods": cmd_methods,
    "generate": cmd_generate,
    "check": cmd_check,
    "theory": cmd_theory,
    "bench": cmd_bench,
    "tune": cmd_tune,
    "serve": cmd_serve,
    "cost-curve": cmd_cost_curve,
    "reproduce": cmd_reproduce,
    "cache": cmd_cache,
    "compiled": cmd_cache,
    "compile": cmd_compile,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from ..api import quiet_transformers

    quiet_transformers()  # model loading bars would drown the generated text
    try:
        if args.command == "distill":
            from ..tools.distill.cli import run as run_distill

            return run_distill(args)
        return COMMANDS[args.command](args)
    except ValueError as e:
        print("multispec: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except BrokenPipeError:  # the output was piped into a reader that stopped (| head)
        sys.stderr.close()
        return 0
    except OSError as e:  # a model id or path that cannot be loaded
        print("multispec: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nmultispec: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
