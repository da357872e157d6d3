"""Sample Factory 2.1 APPO on a VizDoom scenario, on CPU, for a fixed wall time: a peer for distrl on SF's benchmark.

    bash bench/peers/setup_sample_factory.sh          # once: makes bench/peers/.venv-sf (vizdoom included)
    bench/peers/.venv-sf/bin/python bench/peers/sample_factory_vizdoom.py --env doom_basic --train_for_seconds 600
    bench/peers/.venv-sf/bin/python bench/peers/sample_factory_vizdoom.py --env doom_basic --train_for_seconds 900 \\
        --target 80                                   # time to a mean game score of 80 over the last 100 episodes

It runs Sample Factory's own VizDoom example (sf_examples.vizdoom: its scenario .cfg/.wad files, its action spaces,
reward scaling and shaping, and its Doom hyper-parameters) with `--device cpu --num_workers 2 --num_envs_per_worker 4
--worker_num_splits 2`, in an experiment dir under a temp dir that is deleted afterwards. What SF does to a Doom frame:
the game renders at 160x120 (SetResolutionWrapper, whatever the .cfg says), ResizeWrapper takes it to 128x72 RGB
(nearest neighbour), channels first; each action is repeated 4 tics (env_frameskip=4, inside DoomGame.make_action);
no frame stack. The agent: convnet_simple (conv 32 8x8/4, 64 4x4/2, 128 3x3/2, ELU, linear 512), a GRU of 512,
rollout 32 = recurrence 32, batch 1024, 1 epoch, lr 1e-4, symmetric-KL exploration loss 0.001, inputs and returns
normalized, asynchronous (async_rl=True: SF's default, which its Doom defaults keep).

Prints one JSON line:

  env_frames_per_s(_steady), agent_steps_per_s(_steady), sampled_agent_steps_per_s, env_frames, wall_s,
  total_wall_s        throughput, as bench/peers/sample_factory_atari.py defines them (frames count frameskip:
                      one agent step = 4 game tics; distrl counts agent steps)
  curve               one row per `--curve_every` seconds of training (from the start of sampling):
                      [t_s, env_frames trained on by then, episodes that ended in the window, their mean game score,
                      the mean game score of the last `--window` episodes]; null where no episode ended
  final_score_mean    mean game score of the last `--window` episodes (final_sf_reward_mean: SF's own "Avg
                      episode reward", scaled and shaped as it trains on it; final_len_mean: in agent steps)
  time_to_target_s, env_frames_to_target   with `--target`: when the mean game score of the last `--window`
                      episodes first reached it (seconds from the start of sampling); null if it did not. The run
                      stops there unless `--no_stop`

The game score is DoomGame.get_total_reward() at each episode's end: the scenario's own rewards summed (for
doom_basic: -1 a tic alive, -5 a missed shot, +100 the kill), before SF's reward scaling (0.01 for doom_basic,
doom_deadly_corridor) and its gathering reward shaping (+1 a health pickup), the sum a gymnasium VizDoom env's step
rewards give over an episode with the same .cfg. SF's .cfg files are not vizdoom's own: doom_basic's differs in
rendering only (HUD on, decals and particles off, more game variables); the health gathering ones differ in rewards
(living reward 0.01 for vizdoom's 1, no death penalty for vizdoom's 100), buttons (MOVE_BACKWARD added) and, for
_supreme, the .wad. Compare episode lengths there, or give distrl SF's .cfg (see bench/RESULTS.md).

Any other argument goes to Sample Factory as is (e.g. `--res_w 84 --res_h 84`, `--async_rl False`, `--rnn_size 256`,
`--encoder_conv_architecture convnet_atari --nonlinearity relu` for the Nature CNN distrl's `nature` torso is).
As in the Atari peer, an observer feeds the `--train_for_seconds` counter that 2.1.1 never updates.
"""

from __future__ import annotations

import math
import time

import gymnasium as gym

from sample_factory_common import base_parser, r1, report, run, temp_train_dir, throughput, wall_clock_class

GAME_SCORE = "game_score"


class GameScore(gym.Wrapper):
    """Puts the game's own episode score (DoomGame.get_total_reward(): unscaled, unshaped) into the info of an
    episode's last step, as info["episode_extra_stats"]["game_score"], which SF hands to the runner's episodic stats."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = dict(info)
            info.setdefault("episode_extra_stats", {})[GAME_SCORE] = float(self.env.unwrapped.game.get_total_reward())
        return obs, reward, terminated, truncated, info


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None, **kwargs):
    """Sample Factory's own Doom env for `full_env_name` (make_doom_env), inside GameScore."""
    from sf_examples.vizdoom.doom.doom_utils import make_doom_env

    return GameScore(make_doom_env(full_env_name, cfg, env_config, render_mode=render_mode, **kwargs))


def single_player_envs() -> list[str]:
    """SF's Doom scenarios with one agent and no bots (the others start several DoomGame instances per env)."""
    from sf_examples.vizdoom.doom.doom_utils import DOOM_ENVS

    return [s.name for s in DOOM_ENVS if s.num_agents == 1 and s.num_bots == 0]


def r3(x: float):
    """`x` rounded to three decimals, or None for NaN."""
    return None if math.isnan(x) else round(x, 3)


def mean(xs) -> float:
    """The mean of `xs`, NaN if empty."""
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    ours = base_parser(__doc__.split("\n")[0], "doom_basic", single_player_envs())
    ours.add_argument("--target", type=float, default=None,
                      help="game score whose mean over --window episodes ends the run")
    ours.add_argument("--window", type=int, default=100,
                      help="episodes averaged for --target and the curve (SF's stats_avg)")
    ours.add_argument("--no_stop", action="store_true", help="train on for --train_for_seconds after the target")
    ours.add_argument("--curve_every", type=float, default=10.0, help="seconds per row of the curve")
    args, passthrough = ours.parse_known_args()

    from importlib.metadata import version

    from sample_factory.envs.env_utils import register_env
    from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_models

    class Progress(wall_clock_class()):
        """WallClock (which feeds the --train_for_seconds counter) that also records (t, env frames trained) after
        each training step and every finished episode, and ends the run once the target is reached."""

        reached = None  # (t, env_frames) when the target was first met

        def __init__(self):
            self.frames = []  # (t, env frames trained on)
            self.episodes = []  # (t, game score, SF's reward, length in agent steps)

        def on_training_step(self, runner, training_iteration_since_resume):
            super().on_training_step(runner, training_iteration_since_resume)
            self.frames.append((runner.total_train_seconds, runner.env_steps.get(0, 0)))
            if self.reached is not None and not args.no_stop:
                runner.total_train_seconds = float("inf")

        def on_episode(self, runner, msg, policy_id):
            s = msg["episodic"]
            score = s.get("episode_extra_stats", {}).get(GAME_SCORE, float("nan"))
            # SF counts an episode's length in frames (summaries_use_frameskip): back to agent steps
            steps = int(s["len"]) // (runner.cfg.env_frameskip if runner.cfg.summaries_use_frameskip else 1)
            self.episodes.append((self.now(), float(score), float(s["reward"]), steps))
            last = [e[1] for e in self.episodes[-args.window:]]
            if (args.target is not None and self.reached is None and len(last) == args.window
                    and mean(last) >= args.target):
                self.reached = (self.now(), runner.env_steps.get(0, 0))

    def curve(p: Progress) -> list:
        rows, end = [], args.curve_every
        horizon = max([t for t, _ in p.frames] + [t for t, *_ in p.episodes] + [0.0])
        while end <= horizon + args.curve_every:
            frames = max([n for t, n in p.frames if t <= end] + [0])
            in_window = [e[1] for e in p.episodes if end - args.curve_every < e[0] <= end]
            last = [e[1] for e in p.episodes if e[0] <= end][-args.window:]
            rows.append([round(end, 1), int(frames), len(in_window), r1(mean(in_window)), r1(mean(last))])
            end += args.curve_every
        return rows

    t_begin = time.time()
    # a DoomGame writes _vizdoom.ini and _vizdoom/ into the working dir: into the temp dir
    with temp_train_dir("sf_vizdoom_", args.keep_dir, chdir=True) as train_dir:
        register_env(args.env, make_env)  # train_vizdoom's register_vizdoom_envs(), for this one env, in GameScore
        register_vizdoom_models()
        progress = Progress()
        cfg, runner, status = run(parse_vizdoom_cfg, args, train_dir, passthrough, progress, progress.on_episode)
        last = progress.episodes[-args.window:]
        out = {
            "framework": "sample-factory", "version": version("sample-factory"), "vizdoom": version("vizdoom"),
            "algo": "APPO", "env": args.env, "device": "cpu", "num_workers": cfg.num_workers,
            "num_envs_per_worker": cfg.num_envs_per_worker, "worker_num_splits": cfg.worker_num_splits,
            "async_rl": cfg.async_rl, "frameskip": cfg.env_frameskip, "obs": [3, cfg.res_h, cfg.res_w],
            "encoder": cfg.encoder_conv_architecture, "rnn": f"{cfg.rnn_type}{cfg.rnn_size}" if cfg.use_rnn else None,
            "rollout": cfg.rollout, "recurrence": cfg.recurrence, "batch_size": cfg.batch_size,
            "status": int(status), **throughput(cfg, runner, t_begin),
            "episodes": len(progress.episodes), "window": args.window,
            "final_score_mean": r1(mean(e[1] for e in last)), "final_sf_reward_mean": r3(mean(e[2] for e in last)),
            "final_len_mean": r1(mean(e[3] for e in last)),
            "target": args.target,
            "time_to_target_s": round(progress.reached[0], 1) if progress.reached else None,
            "env_frames_to_target": int(progress.reached[1]) if progress.reached else None,
            "curve_every_s": args.curve_every, "curve": curve(progress),
            "train_for_seconds": args.train_for_seconds, "extra_args": passthrough,
        }
        report(out, status, args, train_dir)


if __name__ == "__main__":
    main()
