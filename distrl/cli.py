"""`distrl train | resume | eval | record | export | config | timeline | report | plot | tune`: the command line. User mistakes -> one line on stderr, exit 2."""
from __future__ import annotations

import time

START = time.time()  # before heavy imports: time-to-solve counts from the command's start

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


# Exit statuses: 0 the run ended normally (solved or a stop condition), 1 a fault stopped it (summary.json
# says which, the newest checkpoint resumes it), 2 bad input (nothing was written), 130 interrupted.
EXIT_FAULT, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: same one-line contract
        raise UsageError(message)


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train from a YAML config")
    p.add_argument("config", help="YAML config file (see configs/)")
    p.add_argument("--mode", choices=["single", "sync", "async"], help="run mode (sets mode)")
    p.add_argument("--workers", type=int, help="rollout workers (sets workers)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set replay.alpha=0.5 (repeatable)")
    p.add_argument("--run-dir", help="where results go (default runs/<algo>_<env>_<mode>_<time>)")
    p.add_argument("--address", help="join this Ray cluster (e.g. auto); default: embedded local Ray")
    p.add_argument("--device", help="learner (and central inference server) device: auto, cpu, cuda, cuda:N")
    p.add_argument("--max-seconds", type=float, help="wall-time budget in seconds (sets stop.max_seconds)")
    p.add_argument("--seed", type=int, help="base seed (sets seed)")


def _resume_parser(sub) -> None:
    p = sub.add_parser("resume", help="continue a run from its newest complete checkpoint")
    p.add_argument("run_dir", help="the run dir to continue")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for the rest of the run, e.g. --set stop.max_seconds=600")
    p.add_argument("--max-seconds", type=float, help="total wall-time budget, time already spent included")
    p.add_argument("--address", help="join this Ray cluster; default: embedded local Ray")


def _eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="greedy evaluation of a run's best checkpoint")
    p.add_argument("run_dir", help="the run dir whose checkpoints/best.safetensors is played (its newest checkpoint's "
                   "weights when no evaluation finished)")
    p.add_argument("--episodes", type=int, default=None, help="greedy episodes (default 20; 1 with --video)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs")
    p.add_argument("--video", metavar="FILE.mp4", help="film the episodes, one after another, into this mp4")


def _record_parser(sub) -> None:
    p = sub.add_parser("record", help="play a run's best checkpoint into a Minari dataset")
    p.add_argument("run_dir", help="the run dir whose checkpoints/best.safetensors is played (its newest checkpoint's "
                   "weights when no evaluation finished)")
    p.add_argument("--episodes", type=int, required=True, help="whole episodes to record")
    p.add_argument("-o", "--output", required=True, metavar="DATASET",
                   help="the new dataset's directory, named like name-vN (Minari's dataset ids)")
    p.add_argument("--epsilon", type=float, default=0.0, help="replace each action by a random one with this probability")
    p.add_argument("--explore", action="store_true", help="act with the policy's own exploration (sampling)")
    p.add_argument("--seed", type=int, default=12345, help="seed of the recording envs")


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="write a run's best policy as an ONNX (or TorchScript) file")
    p.add_argument("run_dir", help="the run dir whose checkpoints/best.safetensors is exported (its newest "
                   "checkpoint's weights when no evaluation finished)")
    p.add_argument("--onnx", metavar="FILE", help="ONNX file: obs -> action and the network's outputs")
    p.add_argument("--torchscript", metavar="FILE", help="TorchScript file (torch.jit.load) of the same network")


def cmd_export(args) -> int:
    from distrl.api import export

    out = export(args.run_dir, args.onnx, args.torchscript)
    for path, size in out["files"].items():
        print(f"{path}: {size} bytes, outputs {', '.join(out['outputs'])} (checkpoint version {out['version']})")
    return 0


def _config_parser(sub) -> None:
    p = sub.add_parser("config", help="print a config as a run would read it: every key, its value and its doc")
    p.add_argument("config", help="YAML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set ppo.lr=1e-3 (repeatable)")


def _tune_parser(sub) -> None:
    p = sub.add_parser("tune", help="a hyperparameter sweep on Ray Tune: each trial a run, a table at the end")
    p.add_argument("config", nargs="?", help="YAML config file (not with --resume)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="values to try for a config key (repeatable: the grid is their product), or a range "
                        "to sample: KEY='loguniform(1e-4,1e-2)' (also uniform, randint)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for every trial (repeatable)")
    p.add_argument("--dir", help="the sweep dir (default sweeps/<algo>_<env>_<time>)")
    p.add_argument("--samples", type=int, default=1, help="trials per grid point (random search: trials)")
    p.add_argument("--search", choices=["grid", "random"], default="grid",
                   help="grid: every combination; random: values drawn per trial")
    p.add_argument("--scheduler", choices=["none", "asha"], default="none", help="asha: stop bad trials early")
    p.add_argument("--metric", default="best_eval_return", help="what the table and the scheduler rank by")
    p.add_argument("--grace-period", type=float, help="asha: env steps (or seconds) before a trial may be stopped")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as many as the resources allow)")
    p.add_argument("--address", help="run the trials on this Ray cluster (e.g. auto); default: embedded Ray")
    p.add_argument("--resume", metavar="SWEEP_DIR", help="continue a killed sweep; finished trials are not run again")


def cmd_tune(args) -> int:
    from distrl.api import resume, train
    from distrl.checks import validate
    from distrl.runtime.tune import resume_sweep, run_sweep
    from distrl.runtime.tune_table import format_table

    if args.resume:
        if args.config or args.grid or args.overrides:
            raise UsageError("--resume takes the sweep dir only: its config and grid are in sweep.json")
        sweep = resume_sweep(args.resume, train=train, resume=resume, address=args.address)
    else:
        if not args.config:
            raise UsageError("tune needs a CONFIG (or --resume SWEEP_DIR)")
        sweep = run_sweep(args.config, args.grid, train=train, resume=resume, validate=validate,
                          overrides=args.overrides, sweep_dir=args.dir, samples=args.samples, search=args.search,
                          scheduler=args.scheduler, metric=args.metric, max_concurrent=args.max_concurrent,
                          address=args.address, grace_period=args.grace_period)
    print(format_table(sweep["trials"]))
    failed = [r for r in sweep["trials"] if str(r["stop_reason"]).startswith("error")]
    print(f"sweep: {sweep['dir']}  ({len(sweep['trials'])} trials, {len(failed)} failed; trials.csv; "
          f"curves: distrl plot {sweep['dir']})")
    return EXIT_FAULT if failed else 0


def _window_flags(p) -> None:
    p.add_argument("--from", dest="t_from", type=float, metavar="S", help="window start, seconds since the run's start")
    p.add_argument("--to", dest="t_to", type=float, metavar="S", help="window end, seconds since the run's start")


def _observe_parsers(sub) -> None:
    p = sub.add_parser("timeline", help="draw a traced run's processes over time as a PNG")
    p.add_argument("run_dir", help="a run dir trained with log.trace: true")
    _window_flags(p)
    p.add_argument("-o", "--output", help="PNG to write (default RUN_DIR/timeline.png)")
    p = sub.add_parser("report", help="where a traced run's time went, and its bottleneck")
    p.add_argument("run_dir", help="a run dir trained with log.trace: true")
    _window_flags(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p = sub.add_parser("plot", help="learning curves of runs, grouped by algo, env and mode")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run dirs, or a sweep dir (its trials)")
    p.add_argument("-o", "--output", help="PNG to write (default plot.png in the first run dir)")


def _observe(fn, *args, **kwargs):
    """Run an observe command; a run dir lacking its data is a user mistake, not a traceback."""
    from distrl.observe.rundir import RunDataError

    try:
        return fn(*args, **kwargs)
    except RunDataError as e:
        raise UsageError(str(e)) from None


def cmd_timeline(args) -> int:
    from distrl.observe.timeline import run_timeline

    print(_observe(run_timeline, args.run_dir, args.t_from, args.t_to, args.output))
    return 0


def cmd_report(args) -> int:
    from distrl.observe.report import run_report

    print(_observe(run_report, args.run_dir, args.json, args.t_from, args.t_to))
    return 0


def cmd_plot(args) -> int:
    from distrl.observe.plot import run_plot

    print(_observe(run_plot, args.run_dirs, args.output))
    return 0


def cmd_train(args) -> int:
    from distrl.api import train

    overrides = list(args.overrides)
    for key, flag in (("mode", args.mode), ("workers", args.workers), ("device", args.device),
                      ("stop.max_seconds", args.max_seconds), ("seed", args.seed)):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    summary = train(args.config, overrides=overrides, run_dir=args.run_dir, address=args.address,
                    start_time=START)
    return report(summary)


def cmd_resume(args) -> int:
    from distrl.api import resume

    overrides = list(args.overrides)
    if args.max_seconds is not None:
        overrides.append(f"stop.max_seconds={args.max_seconds}")
    return report(resume(args.run_dir, overrides=overrides, address=args.address))


def report(summary: dict) -> int:
    solved = (f"solved in {summary['time_to_solve_s']:.1f} s" if summary["solved"]
              else f"not solved ({summary['stop_reason']})")
    best = summary["best_eval_return"]
    print(f"{summary['algo']} on {summary['env']} ({summary['mode']}): {solved}; "
          f"best eval {best if best is None else round(best, 1)}; {summary['env_steps']} env steps, "
          f"{summary['updates']} updates in {summary['wall_s']:.1f} s")
    print(f"results: {summary['run_dir']}  (metrics.csv, summary.json, checkpoints/, tb/)")
    if summary.get("failure"):
        print(f"distrl: {summary['failure']}", file=sys.stderr)
    if summary["stop_reason"] == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_FAULT if summary.get("failure") else 0


def cmd_record(args) -> int:
    from distrl.api import record

    out = record(args.run_dir, args.episodes, args.output, args.epsilon, args.explore, args.seed)
    print(f"{out['dataset']}: {out['episodes']} episodes, {out['steps']} steps, return "
          f"{out['return_mean']:.1f} ± {out['return_std']:.1f}")
    return 0


def cmd_config(args) -> int:
    from distrl.config import describe, load_config

    print("\n".join(describe(load_config(args.config, args.overrides))))
    return 0


def cmd_eval(args) -> int:
    from distrl.api import evaluate

    episodes = args.episodes if args.episodes is not None else 1 if args.video else 20
    if episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {episodes}")
    result = evaluate(args.run_dir, episodes, args.seed, video=args.video)
    if args.video:
        print(f"{args.video}: {len(result['returns'])} episode(s), {result['frames']} frames")
    print(f"{result['env']}: {result['mean']:.1f} ± {result['std']:.1f} over {len(result['returns'])} greedy "
          f"episodes (checkpoint version {result['version']})")
    return 0


def _one_line(e: BaseException) -> str:
    """The message on one line, printable whatever it quotes (a lone surrogate becomes an escape)."""
    return " ".join(str(e).split()).encode("utf-8", "backslashreplace").decode("utf-8")


def build_parser() -> argparse.ArgumentParser:
    """The `distrl` command and its subcommands (the CLI reference of the docs is generated from it)."""
    parser = _Parser(prog="distrl", description="distributed deep RL on Ray + PyTorch")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _train_parser(sub)
    _resume_parser(sub)
    _eval_parser(sub)
    _record_parser(sub)
    _config_parser(sub)
    _export_parser(sub)
    _observe_parsers(sub)
    _tune_parser(sub)
    return parser


def _user_modules_importable() -> None:
    """A user's own modules (`model.torso: my_nets:Torso`, an env or wrapper `module:Class`) import from the
    directory distrl runs in, as they would under `python -m`: the `distrl` script's own directory is the
    one Python put first on the path, not the working directory. Ray's embedded workers get the same path."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _user_modules_importable()
    from distrl.checkpoint import CheckpointError
    from distrl.config import ConfigError
    from distrl.core import RoleLost, RoleRestarted
    from distrl.data.datasets import DatasetError

    try:
        args = parser.parse_args(argv)
        commands = {"train": cmd_train, "resume": cmd_resume, "eval": cmd_eval, "record": cmd_record, "config": cmd_config, "export": cmd_export,
                    "timeline": cmd_timeline, "report": cmd_report, "plot": cmd_plot, "tune": cmd_tune}
        return commands[args.command](args)
    except (UsageError, ConfigError, CheckpointError, DatasetError) as e:
        print(f"distrl: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except (RoleLost, RoleRestarted) as e:  # a run that could not start (a busy cluster, a role dying)
        print(f"distrl: could not start: {_one_line(e)}", file=sys.stderr)
        return EXIT_FAULT
    except KeyboardInterrupt:
        print("distrl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run() -> None:
    """The `distrl` command: main(), then out at once. A run's files are closed and its roles ended by then;
    what is left is Ray's own shutdown and the interpreter's teardown of torch and Ray's modules, which took
    1.5 s more than the shutdown alone on a 2-core VM (3x that on a loaded one) and counts against a run's
    promise to end within 10 s of its budget."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if "ray" in sys.modules:
        from distrl.runtime.ray_setup import leave_ray

        leave_ray()
    os._exit(code)


if __name__ == "__main__":
    run()
