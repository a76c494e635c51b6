from .base import LanguageModel
from .hf import HFModel
from .markov import MarkovLM

__all__ = ["HFModel", "LanguageModel", "MarkovLM"]
