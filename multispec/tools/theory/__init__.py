"""Seed 002's theory as software: exact calculators, simulations with the real decoders, figures, and a
bridge that predicts `sd`'s acceptance on a real model pair."""

from .calculators import (
    Rejections,
    batch_first_token,
    batch_rejections,
    loss_of,
    loss_star,
    optimal_resampling,
    pareto,
    rejection,
    relaxed_acceptance,
    sd_rejections,
    tradeoff_curve,
    tv,
    uniform_rows,
)

__all__ = [
    "Rejections",
    "batch_first_token",
    "batch_rejections",
    "loss_of",
    "loss_star",
    "optimal_resampling",
    "pareto",
    "rejection",
    "relaxed_acceptance",
    "sd_rejections",
    "tradeoff_curve",
    "tv",
    "uniform_rows",
]
