"""Sample Factory 2.1 APPO on Atari Breakout, on CPU, for a fixed wall time: a throughput peer for distrl.

    bash bench/peers/setup_sample_factory.sh          # once: makes bench/peers/.venv-sf
    bench/peers/.venv-sf/bin/python bench/peers/sample_factory_atari.py --train_for_seconds 600

It runs Sample Factory's own Atari example (sf_examples.atari: env `atari_breakout`, its shipped preprocessing --
noop reset, max-and-skip 4, episodic life, fire reset, reward clipping, 84x84 grayscale, frame stack 4 -- and its
Atari hyper-parameters) with `--device cpu --num_workers 2 --num_envs_per_worker 4 --worker_num_splits 2`, in an
experiment dir under a temp dir that is deleted afterwards, and prints one JSON line:

  env_frames_per_s         Sample Factory's own final figure ("Collected {...}, FPS: X" at the end of its log):
                           env frames trained on since start / wall time of its main loop (process start-up
                           and env creation included)
  env_frames_per_s_steady  the same rate from its periodic "Fps is (...)" records (every 5 s, the last 300 s
                           kept), from the first with frames > 0 to the last: start-up excluded. Frames are
                           counted a training batch at a time, so over a short run this is coarse
  agent_steps_per_s(_steady)  the two above / frameskip (4)
  sampled_agent_steps_per_s  its "Throughput" figure: observations the policy worker processed per second (agent
                           steps collected, not yet trained on), over its last ~50 s of records
  env_frames, wall_s (the main loop), total_wall_s (this script, set-up included), sample_factory version.

Frames here count frame skip, as Sample Factory reports them (summaries_use_frameskip=True in its Atari defaults):
one agent step = 4 emulator frames. distrl's bench/RESULTS.md reports agent steps, so compare its figures with
agent_steps_per_s, or with env_frames_per_s / 4.

`atari_breakout` is Sample Factory's definition: BreakoutNoFrameskip-v4 (no sticky actions). `--env
atari_breakout_v5` keeps the same wrappers on ALE/Breakout-v5 with frameskip=1 and its default sticky actions
(0.25), as distrl's Breakout preset does; the emulator work per frame is the same. Any other argument is passed to
Sample Factory as is (e.g. `--num_envs_per_worker 8`, `--async_rl True`).

Sample Factory 2.1.1 (the last release on PyPI) never updates the counter that `--train_for_seconds` is checked
against, so that flag alone would never stop it (fixed upstream after the release, PR #330); an observer here sets
the counter after each training iteration, measured from the start of sampling.
"""

from __future__ import annotations

import time

from sample_factory_common import base_parser, report, run, temp_train_dir, throughput, wall_clock_class

FRAMESKIP = 4
V5_NAME = "atari_breakout_v5"
V5_GYM_ID = "ALE/BreakoutFrameskip1-v5"


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    """Sample Factory's make_atari_env, after `import ale_py` (ale-py >= 0.9 registers its envs on import only;
    this runs in each spawned worker process, where nothing has imported it yet)."""
    import ale_py  # noqa: F401
    import gymnasium as gym
    from sf_examples.atari import atari_utils

    if full_env_name == V5_NAME and V5_GYM_ID not in gym.registry:
        v5 = gym.spec("ALE/Breakout-v5")
        gym.register(V5_GYM_ID, entry_point=v5.entry_point, kwargs={**v5.kwargs, "frameskip": 1},
                     max_episode_steps=v5.max_episode_steps)
        atari_utils.ATARI_ENVS.append(atari_utils.AtariSpec(V5_NAME, V5_GYM_ID))
    return atari_utils.make_atari_env(full_env_name, cfg, env_config, render_mode=render_mode)


def main() -> None:
    ours = base_parser(__doc__.split("\n")[0], "atari_breakout", ["atari_breakout", V5_NAME])
    args, passthrough = ours.parse_known_args()

    from importlib.metadata import version

    from sample_factory.envs.env_utils import register_env
    from sf_examples.atari.train_atari import parse_atari_args

    t_begin = time.time()
    with temp_train_dir("sf_atari_", args.keep_dir) as train_dir:
        register_env(args.env, make_env)  # train_atari's register_atari_envs(), plus `import ale_py` first
        cfg, runner, status = run(parse_atari_args, args, train_dir, passthrough, wall_clock_class()())
        out = {
            "framework": "sample-factory", "version": version("sample-factory"), "algo": "APPO",
            "env": args.env, "env_id": V5_GYM_ID if args.env == V5_NAME else "BreakoutNoFrameskip-v4",
            "device": "cpu", "num_workers": cfg.num_workers, "num_envs_per_worker": cfg.num_envs_per_worker,
            "worker_num_splits": cfg.worker_num_splits, "async_rl": cfg.async_rl, "frameskip": cfg.env_frameskip,
            "status": int(status), **throughput(cfg, runner, t_begin),
            "train_for_seconds": args.train_for_seconds, "extra_args": passthrough,
        }
        report(out, status, args, train_dir)


if __name__ == "__main__":
    main()
