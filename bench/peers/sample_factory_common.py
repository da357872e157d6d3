"""What the Sample Factory 2.1 peers (sample_factory_atari.py, sample_factory_vizdoom.py) share: their common
arguments, the temp experiment dir, the wall-clock observer that makes `--train_for_seconds` take effect, the run
itself, and the throughput fields of their JSON line.

No Sample Factory import at the top: the peers' spawned worker processes import this module again, and their
`--help` should not wait for torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time


def r1(x: float):
    """`x` rounded to one decimal, or None for NaN (JSON has no NaN)."""
    return None if math.isnan(x) else round(x, 1)


def rate(stats) -> float:
    """Count per second over Sample Factory's periodic (time, running count) records, from the first record with a
    non-zero count to the last: process start-up and the wait for the first batch are left out."""
    stats = [(t, n) for t, n in stats if n]
    if len(stats) < 2 or stats[-1][0] <= stats[0][0]:
        return float("nan")
    return (stats[-1][1] - stats[0][1]) / (stats[-1][0] - stats[0][0])


def base_parser(description: str, env_default: str, env_choices) -> argparse.ArgumentParser:
    """The arguments both peers take: --train_for_seconds, --env, the worker layout and --keep_dir."""
    ours = argparse.ArgumentParser(description=description)
    ours.add_argument("--train_for_seconds", type=int, required=True)
    ours.add_argument("--env", default=env_default, choices=env_choices)
    ours.add_argument("--num_workers", type=int, default=2)
    ours.add_argument("--num_envs_per_worker", type=int, default=4)
    ours.add_argument("--worker_num_splits", type=int, default=2)
    ours.add_argument("--keep_dir", action="store_true", help="keep the experiment dir (its sf_log.txt, summaries)")
    return ours


@contextlib.contextmanager
def temp_train_dir(prefix: str, keep: bool, chdir: bool = False):
    """A temp train dir (the working dir inside it if `chdir`), deleted on exit unless `keep`."""
    train_dir = tempfile.mkdtemp(prefix=prefix)
    cwd = os.getcwd()
    try:
        if chdir:
            os.chdir(train_dir)
        yield train_dir
    finally:
        if chdir:
            os.chdir(cwd)
        if not keep:
            shutil.rmtree(train_dir, ignore_errors=True)


def wall_clock_class():
    """The WallClock observer class (made on call, so Sample Factory is imported only then)."""
    from sample_factory.algo.runners.runner import AlgoObserver

    class WallClock(AlgoObserver):
        """Feeds runner.total_train_seconds, which 2.1.1 leaves at 0, so --train_for_seconds takes effect."""

        t0 = None

        def now(self) -> float:
            """Seconds since the start of sampling (0 before it)."""
            return time.time() - (self.t0 or time.time())

        def on_start(self, runner):
            self.t0 = time.time()

        def on_training_step(self, runner, training_iteration_since_resume):
            runner.total_train_seconds = self.now()

    return WallClock


def run(parse_cfg, args, train_dir: str, passthrough, observer, episodic_handler=None):
    """Parses SF's config (our worker layout, CPU, `train_dir`, then `passthrough`), makes the runner, registers
    `observer` (and `episodic_handler`), and runs it: (cfg, runner, status)."""
    from sample_factory.train import make_runner

    cfg = parse_cfg(argv=[
        f"--env={args.env}", "--device=cpu", f"--train_dir={train_dir}", "--experiment=bench",
        f"--num_workers={args.num_workers}", f"--num_envs_per_worker={args.num_envs_per_worker}",
        f"--worker_num_splits={args.worker_num_splits}", f"--train_for_seconds={args.train_for_seconds}",
        "--with_wandb=False", *passthrough,
    ])
    cfg, runner = make_runner(cfg)
    runner.register_observer(observer)
    if episodic_handler is not None:
        runner.register_episodic_stats_handler(episodic_handler)
    status = runner.init()
    if status == 0:
        status = runner.run()
    return cfg, runner, status


def throughput(cfg, runner, t_begin: float) -> dict:
    """The throughput fields of a peer's JSON line (see sample_factory_atari.py's docstring for each)."""
    frames = runner.total_env_steps_since_resume or 0
    wall = runner.timing.get("main_loop", float("nan"))
    steady = rate(runner.fps_stats)
    sampled = rate(runner.throughput_stats[0])
    fps = frames / wall if wall else float("nan")
    return {
        "env_frames_per_s": r1(fps), "agent_steps_per_s": r1(fps / cfg.env_frameskip),
        "env_frames_per_s_steady": r1(steady), "agent_steps_per_s_steady": r1(steady / cfg.env_frameskip),
        "sampled_agent_steps_per_s": r1(sampled),
        "env_frames": int(frames), "wall_s": round(wall, 2), "total_wall_s": round(time.time() - t_begin, 2),
    }


def report(out: dict, status: int, args, train_dir: str) -> None:
    """Prints `out` as one JSON line (with the experiment dir if --keep_dir) and exits 0 if SF's status was 0."""
    if args.keep_dir:
        out["experiment_dir"] = f"{train_dir}/bench"
    print(json.dumps(out), flush=True)
    sys.exit(0 if status == 0 else 1)
