"""distrl: distributed deep RL on Ray and PyTorch that you can read in an afternoon."""
from distrl.api import evaluate, resume, train
from distrl.config import Config, ConfigError, load_config
from distrl.version import __version__

__all__ = ["Config", "ConfigError", "evaluate", "load_config", "resume", "train", "__version__"]
