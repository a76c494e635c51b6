"""The arguments of `multispec distill`, apart from its code so that `multispec --help` loads no torch."""

from __future__ import annotations


def add_parser(sub) -> None:
    d = sub.add_parser("distill", help="train a small draft for a target by distillation, or --eval a pair")
    d.add_argument("--target", default=None, help="hub id or path (default: the embedded SmolLM2-135M-Instruct)")
    d.add_argument("--out", default=None, help="output folder (teacher data, checkpoints, log, draft/)")
    d.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    d.add_argument(
        "--kind",
        choices=["draft", "eagle"],
        default="draft",
        help="draft: a small transformers model; eagle: a feature-level head that drafts from the target's hidden "
        "states (EAGLE-3), written to --out/eagle in the speculators layout (default %(default)s)",
    )
    d.add_argument(
        "--draft-vocab",
        type=int,
        default=16384,
        help="with --kind eagle: the head's vocabulary, the tokens the target's answers hold most "
        "(default %(default)s)",
    )
    d.add_argument("--prompts", type=int, default=768, help="training prompts from the pool (default %(default)s)")
    d.add_argument(
        "--self-prompts",
        type=int,
        default=0,
        help="also train on this many prompts the target writes itself (sampled user turns; default 0)",
    )
    d.add_argument(
        "--on-policy",
        type=int,
        default=0,
        metavar="N",
        help="before training, the draft answers N of the training prompts itself (half sampled at "
        "temperature 1, half greedily) and the target scores its answers; these are trained on too "
        "(default 0)",
    )
    d.add_argument("--max-new-tokens", type=int, default=160, help="answer length for teacher data")
    d.add_argument("--gen-batch", type=int, default=32)
    d.add_argument("--steps", type=int, default=1500)
    d.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="also stop training after this many minutes; the learning-rate schedule follows the clock",
    )
    d.add_argument("--batch-tokens", type=int, default=2048, help="answer positions per training step")
    d.add_argument("--lr", type=float, default=2e-3)
    d.add_argument("--hidden", type=int, default=198, help="draft width (default %(default)s)")
    d.add_argument(
        "--layers",
        type=int,
        default=None,
        help="draft layers (default 4; with --init-from, more layers than the saved draft's are added "
        "on top, starting as the identity)",
    )
    d.add_argument(
        "--intermediate",
        type=int,
        default=None,
        help="MLP width (default: the target's; with --init-from, a narrower width keeps the MLP units "
        "that contribute most)",
    )
    d.add_argument(
        "--init",
        choices=["sliced", "embeddings"],
        default="sliced",
        help="sliced: the target's first layers cut to the draft's width; embeddings: only the "
        "embedding table from the target, random layers (default %(default)s)",
    )
    d.add_argument(
        "--init-from",
        default=None,
        metavar="DIR",
        help="continue training a saved draft (e.g. an earlier run's draft/) instead of building one",
    )
    d.add_argument("--heads", type=int, default=None, help="attention heads (default: the target's)")
    d.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: the target's)")
    d.add_argument(
        "--extra-data",
        action="append",
        default=[],
        metavar="DIR",
        help="also train on the teacher shards in DIR (e.g. an earlier run's data/); repeatable",
    )
    d.add_argument(
        "--teacher-dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="the target copy that writes the teacher data: bfloat16 is faster on CPUs with bfloat16 "
        "instructions and within TV 0.01 of a float32 target; float32: the target as loaded "
        "(default %(default)s). Held-out measures always use the target as loaded",
    )
    d.add_argument(
        "--train-dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="autocast the training steps' matrix products to this type (default %(default)s; "
        "1.5-1.8x faster than float32 on a CPU with bfloat16 instructions)",
    )
    d.add_argument("--eval-every", type=int, default=100)
    d.add_argument("--checkpoint-every", type=int, default=50)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--data-dir", default=None, help="folder with the prompt files (default ../shared/data)")
    d.add_argument(
        "--count-tokens",
        action="store_true",
        help="only count the tokens of the target's answers to --prompts pool prompts, into --out/"
        "token_counts.safetensors: put that file beside a draft's config.json and draft_vocab=N keeps its N most "
        "frequent tokens (a draft trained here gets it in draft/)",
    )
    d.add_argument(
        "--eval",
        action="store_true",
        help="measure a pair instead of training: 1 - TV, greedy agreement, expected sd block "
        "efficiency and step-cost ratio on held-out MT-Bench prompts",
    )
    d.add_argument("--draft", default=None, help="with --eval: the draft to measure (default: the default draft)")
    d.add_argument("--eval-prompts", type=int, default=20, help="with --eval: MT-Bench prompts (default %(default)s)")
    d.add_argument(
        "--spread",
        action="store_true",
        help="with --eval: take MT-Bench's categories in turn (its first 20 are all writing and "
        "roleplay) and report each category",
    )
    d.add_argument("--eval-tokens", type=int, default=64, help="with --eval: answer length (default %(default)s)")
    d.add_argument("--json", action="store_true", help="with --eval: print the numbers as one JSON object")
