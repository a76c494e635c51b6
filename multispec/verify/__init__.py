"""Verification rules: pure functions on probability vectors. No models, no caches."""

from .chain import relaxed_verify, residual, speculative_verify

__all__ = ["relaxed_verify", "residual", "speculative_verify"]
