"""multispec: speculative decoding beyond single-token sampling, on one engine."""

from .api import ModelPair, Result, generate, load_model, load_pair
from .decoding import METHODS
from .models.base import LanguageModel
from .models.hf import HFModel
from .models.markov import MarkovLM
from .warp import Sampling

__all__ = [
    "METHODS",
    "HFModel",
    "LanguageModel",
    "MarkovLM",
    "ModelPair",
    "Result",
    "Sampling",
    "generate",
    "load_model",
    "load_pair",
]
__version__ = "0.1.0"
