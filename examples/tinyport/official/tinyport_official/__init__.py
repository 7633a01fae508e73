"""TinyPort: the "official" reference implementation of a toy text-to-image model.

Written in float64 numpy so that it plays the part of an upstream research
repository whose outputs a FastVideo port must reproduce.
"""

from tinyport_official.config import TinyPortConfig
from tinyport_official.weights import init_weights

__all__ = ["TinyPortConfig", "init_weights"]
