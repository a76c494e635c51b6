"""The methods: each a module of propose -> score -> verify -> commit on the shared engine, which declares
its parameters beside its `decode` and registers itself (`registry`). `loop` holds the loop head the drafting
methods share. A new method is a module here, imported below.
"""

from __future__ import annotations

from ..params import DEFAULT_METHOD
from . import ar, beam, bild, dsbd, joint, mtjd, sd, tree  # noqa: F401  (each registers its methods)
from .registry import METHODS, IntOrAuto, Method, Param, coerce, get_method, register

__all__ = ["DEFAULT_METHOD", "METHODS", "IntOrAuto", "Method", "Param", "coerce", "get_method", "register"]
