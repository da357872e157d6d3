"""Environment construction: gymnasium envs from config (ids, presets, wrappers), and a vector of them."""
from distrl.envs.factory import EnvError, check_env, env_spec, make_env
from distrl.envs.vector import VectorEnv

__all__ = ["EnvError", "VectorEnv", "check_env", "env_spec", "make_env"]
