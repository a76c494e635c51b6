"""Verification rules: pure functions on probability vectors. No models, no caches."""

from .chain import residual, speculative_verify

__all__ = ["residual", "speculative_verify"]
