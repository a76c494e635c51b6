"""Verification rules: pure functions on probability vectors. No models, no caches. Every rule returns a
`Verdict`."""

from .beam import acceptance_count_law, beam_distribution, beam_layer_verify, dynamic_width, forest_verify
from .chain import greedy_verify, relaxed_verify, residual, speculative_verify
from .joint import joint_verify
from .multi import (
    batch_verify,
    greedy_tree_verify,
    naive_rejection,
    recursive_rejection,
    tree_verify,
    without_replacement_rejection,
)
from .rollback import rollback_verify
from .verdict import Beam, Verdict

__all__ = [
    "Beam",
    "Verdict",
    "acceptance_count_law",
    "batch_verify",
    "beam_distribution",
    "beam_layer_verify",
    "dynamic_width",
    "forest_verify",
    "greedy_tree_verify",
    "greedy_verify",
    "joint_verify",
    "naive_rejection",
    "recursive_rejection",
    "relaxed_verify",
    "residual",
    "rollback_verify",
    "speculative_verify",
    "tree_verify",
    "without_replacement_rejection",
]
