"""distrl: distributed deep RL on Ray and PyTorch that you can read in an afternoon."""
from distrl.api import resume, train
from distrl.config import Config, ConfigError, load_config

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "load_config", "resume", "train", "__version__"]
