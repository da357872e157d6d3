"""ale-py's threaded AtariVectorEnv against gymnasium's Atari wrappers stepped in distrl's VectorEnv.

    python -m bench.atari_env [--envs 4] [--seconds 8] [--game Breakout]

Two questions, one run:

1. **Same observations?** Both stacks under equal, deterministic settings (no sticky actions, no no-op
   starts, no FIRE on reset, unclipped rewards, 4 frames zero-padded): the same seeded random actions
   are sent to both and every env's frames are compared, pixel for pixel, up to and including the final
   frame of its first episode (ale-py resets on the step after an episode's end, distrl's VectorEnv on
   the same step, so only first episodes line up step for step).
2. **How fast?** Agent steps/s (each = 4 emulator frames) with random actions and the training
   preprocessing of `env.preset: atari` (no-op starts up to 30, sticky actions 0.25, rewards clipped,
   life loss ends the episode): distrl's VectorEnv on one thread, against AtariVectorEnv with 1 thread
   and with one thread per core. Each case gets a third of --seconds.

It also shows where they differ under the preset's settings (`differences`): the range of no-op
starts each draws, and whether a lost life starts a fresh frame stack (DeepMind-style episodes).
"""
from __future__ import annotations

import argparse
import os
import re
import time

import numpy as np

from bench.common import ROOT, hardware, write_json
from distrl.envs.vector import VectorEnv
from distrl.threads import one_compute_thread

SAME = {"noop_max": 0, "frame_skip": 4, "screen_size": 84, "terminal_on_life_loss": False}


def _rom(game: str) -> str:
    """ale-py's ROM name of a game id ('MsPacman' -> 'ms_pacman')."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()


def atari_vector(game: str, num_envs: int, threads: int, **settings):
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(_rom(game), num_envs, num_threads=threads, **settings)


def same_observations(game: str, num_envs: int, seed: int = 0, max_steps: int = 3000) -> dict:
    """Compare both stacks frame by frame over every env's first episode."""
    ours = VectorEnv(f"ALE/{game}-v5", num_envs, seed, {"repeat_action_probability": 0.0, "frameskip": 1}, wrappers=[
        {"AtariPreprocessing": SAME}, {"FrameStackObservation": {"stack_size": 4, "padding_type": "zero"}}])
    theirs = atari_vector(game, num_envs, 1, repeat_action_probability=0.0, noop_max=0, use_fire_reset=False,
                          reward_clipping=False, stack_num=4)
    obs, _ = theirs.reset(seed=seed)
    rng = np.random.default_rng(seed)
    compared, equal = 0, bool(np.array_equal(obs, ours.obs))
    rewards_equal = True
    running = np.ones(num_envs, bool)
    for _ in range(max_steps):
        actions = rng.integers(0, ours.action_space.n, num_envs)
        next_obs, rewards, term, trunc, _ = ours.step(actions)
        obs, r, te, tr, _ = theirs.step(actions)
        equal &= bool(np.array_equal(next_obs[running], obs[running]))
        rewards_equal &= bool(np.array_equal(rewards[running], r[running].astype(np.float32)))
        equal &= bool(np.array_equal((term | trunc)[running], (te | tr)[running]))
        compared += int(running.sum())
        running &= ~(term | trunc)
        if not running.any():
            break
    ours.close()
    theirs.close()
    return {"pixel_identical": equal, "rewards_equal": rewards_equal, "frames_compared": compared,
            "episodes_finished": int((~running).sum())}


def differences(game: str, resets: int = 60) -> dict:
    """Where the two differ under the preset's own settings: the no-op starts each draws (emulator frames
    before the first observation), and whether the frame stack starts afresh after a lost life."""
    from distrl.envs import make_env

    ours = make_env(f"ALE/{game}-v5", {"repeat_action_probability": 0.0}, preset="atari", training=True)
    theirs = atari_vector(game, 1, 1, repeat_action_probability=0.0, noop_max=30, use_fire_reset=False,
                          life_loss_info=True, stack_num=4)
    ours_frames, theirs_frames = [], []
    for seed in range(resets):
        ours.reset(seed=seed)
        ours_frames.append(int(ours.unwrapped.ale.getEpisodeFrameNumber()))
        theirs_frames.append(int(theirs.reset(seed=seed)[1]["episode_frame_number"][0]))
    fresh = {}
    for name, step in (("gymnasium", lambda a: ours.step(a)), ("ale-py", lambda a: theirs.step(np.array([a])))):
        for t in range(2000):  # FIRE now and then, else NOOP: a life is lost within ~100 steps
            obs, _, term, trunc, _ = step(1 if t % 10 == 0 else 0)
            if np.any(term) or np.any(trunc):
                break
        after = ours.reset()[0] if name == "gymnasium" else theirs.step(np.array([0]))[0][0]
        fresh[name] = not after[:3].any()  # zero padding: a new stack
    ours.close()
    theirs.close()
    return {"noop_start_frames": {"gymnasium": [min(ours_frames), max(ours_frames)],
                                  "ale-py": [min(theirs_frames), max(theirs_frames)]},
            "fresh_stack_after_a_lost_life": fresh}


def _rate(step, num_envs: int, seconds: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min(0.5, seconds / 4):  # warm-up
        step()
    steps, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        step()
        steps += num_envs
    return steps / elapsed


def speed_vector_env(game: str, num_envs: int, seconds: float) -> float:
    envs = VectorEnv(f"ALE/{game}-v5", num_envs, 0, preset="atari", training=True)
    rng = np.random.default_rng(0)
    try:
        return _rate(lambda: envs.step(rng.integers(0, envs.action_space.n, num_envs)), num_envs, seconds)
    finally:
        envs.close()


def speed_atari_vector(game: str, num_envs: int, threads: int, seconds: float) -> float:
    env = atari_vector(game, num_envs, threads, repeat_action_probability=0.25, noop_max=30, use_fire_reset=False,
                       reward_clipping=True, life_loss_info=True, stack_num=4)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n = int(env.single_action_space.n)
    try:
        return _rate(lambda: env.step(rng.integers(0, n, num_envs)), num_envs, seconds)
    finally:
        env.close()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0, help="total timed seconds, split over the 3 speed cases")
    p.add_argument("--game", default="Breakout", help="an ALE game, as in ALE/<Game>-v5")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "atari_env.json"))
    args = p.parse_args(argv)
    one_compute_thread()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = args.seconds / 3
    result = {"game": args.game, "envs": args.envs, "seconds_each": share,
              "same": same_observations(args.game, args.envs), "differences": differences(args.game),
              "steps_per_s": {"distrl VectorEnv (gymnasium wrappers)": speed_vector_env(args.game, args.envs, share),
                              "AtariVectorEnv, 1 thread": speed_atari_vector(args.game, args.envs, 1, share),
                              f"AtariVectorEnv, {cores} threads": speed_atari_vector(args.game, args.envs, cores, share)},
              "hardware": hardware()}
    print(f"{args.game}, {args.envs} envs: same observations: {result['same']}")
    print(f"  under the preset's settings: {result['differences']}")
    base = result["steps_per_s"]["distrl VectorEnv (gymnasium wrappers)"]
    for name, rate in result["steps_per_s"].items():
        print(f"  {name:42s} {rate:8.0f} agent steps/s  ({rate / base:.2f}x)")
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
