"""Every seed paper's headline claim, measured on one model pair, in one report.

from multispec.tools.reproduce import reproduce
data = reproduce(pair.target, pair.draft, "reproduce-out", quick=True)   # REPORT.md, claims.json, PNGs
"""

from .claims import EXPERIMENTS, Claim, Experiment, all_claims, select
from .run import load_claims, reproduce
from .stats import Estimate, paired_bootstrap, verdict

__all__ = [
    "EXPERIMENTS",
    "Claim",
    "Estimate",
    "Experiment",
    "all_claims",
    "load_claims",
    "paired_bootstrap",
    "reproduce",
    "select",
    "verdict",
]
