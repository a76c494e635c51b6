"""Verification rules: pure functions on probability vectors. No models, no caches. Every rule returns a
`Verdict`."""

from .chain import relaxed_verify, residual, speculative_verify
from .joint import joint_verify
from .multi import (
    NODE_RULES,
    batch_verify,
    naive_rejection,
    recursive_rejection,
    tree_verify,
    without_replacement_rejection,
)
from .rollback import rollback_verify
from .verdict import Verdict

__all__ = ["NODE_RULES", "Verdict", "batch_verify", "joint_verify", "naive_rejection", "recursive_rejection", "relaxed_verify",
           "residual", "rollback_verify", "speculative_verify", "tree_verify", "without_replacement_rejection"]
