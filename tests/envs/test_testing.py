"""The fault-injecting test envs draw their faults from the seed a run gives them."""
import numpy as np

from distrl.envs import check_env
from distrl.envs.testing import FlakyCartPole, NaNCartPole


def fault_steps(env, seed: int, steps: int = 2000) -> list[int]:
    env.reset(seed=seed)
    out = []
    for t in range(steps):
        try:
            obs, reward, terminated, truncated, _ = env.step(t % 2)
        except RuntimeError:
            out.append(t)
            continue
        if not (np.isfinite(obs).all() and np.isfinite(reward)):
            out.append(t)
        if terminated or truncated:
            env.reset()
    return out


def test_faults_follow_the_first_reset_seed():
    a, b = fault_steps(FlakyCartPole(error_prob=0.05), 3), fault_steps(FlakyCartPole(error_prob=0.05), 3)
    assert a == b and 50 < len(a) < 150
    assert fault_steps(FlakyCartPole(error_prob=0.05), 4) != a
    assert fault_steps(NaNCartPole(nan_prob=0.05), 3) == fault_steps(NaNCartPole(nan_prob=0.05), 3)


def test_a_config_check_of_a_flaky_env_passes_every_time():
    for _ in range(20):
        check_env("distrl.envs.testing:FlakyCartPole-v1", {"error_prob": 0.05})
