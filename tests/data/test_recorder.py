"""Episodes cut from a vector of envs: whole, with their true final observation, in env order."""
import numpy as np

from distrl.data.recorder import EpisodeRecorder
from distrl.envs import VectorEnv


def test_episodes_come_out_whole_with_the_true_final_observation():
    envs = VectorEnv("CartPole-v1", 3, seed=0)
    recorder, rng, episodes, finished = EpisodeRecorder(envs.obs), np.random.default_rng(0), [], []
    start = envs.obs.copy()
    while len(episodes) < 6:
        actions = rng.integers(0, 2, 3)
        nxt, rewards, term, trunc, done = envs.step(actions)
        episodes += recorder.step(actions, rewards, term, trunc, nxt, envs.obs)
        finished += [length for _, length in done]
    assert [len(e.actions) for e in episodes] == finished[:len(episodes)]
    for ep in episodes:
        assert len(ep.observations) == len(ep.actions) + 1 and ep.terminations[-1] and not ep.terminations[:-1].any()
        assert abs(ep.observations[-1][2]) > 0.2 or abs(ep.observations[-1][0]) > 2.4  # CartPole's end: the final obs
    assert any(np.array_equal(ep.observations[0], start[i]) for ep in episodes for i in range(3))
    recorder.restart(envs.obs)
    assert all(len(ep["obs"]) == 1 for ep in recorder.open)
