"""Environment construction: gymnasium envs from config, and a vector of them."""
from distrl.envs.factory import EnvError, env_spec, make_env
from distrl.envs.vector import VectorEnv

__all__ = ["EnvError", "VectorEnv", "env_spec", "make_env"]
