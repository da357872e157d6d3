"""BenchMARL's MAPPO against distrl's MAPPO on MPE simple_spread (3 agents, discrete), same criterion, same clock.

    python -m bench.peers.benchmarl_mappo [--settings benchmarl|same] [--seeds 0 1 2] [--budget-s 600]
                                          [--target -14] [--lock /tmp/distrl-heavy.lock] [--no-ours | --no-peer]
                                          [--out PATH]
    python -m bench.peers.benchmarl_mappo --check-env   # the two packages' simple_spread step for step

Requires `bash bench/peers/setup_benchmarl.sh` (BenchMARL 1.5.2 in bench/peers/.venv-benchmarl); the driver
runs in distrl's venv and launches the peer with that venv's python.

Per seed, alternating, each a fresh process timed from its own start (Python, torch and the library's imports
included): `distrl train configs/mappo_simple_spread.yaml` (bench.solve's solve_once, no TensorBoard) and this
module in child mode, BenchMARL's `Experiment` on one torch thread. The criterion is the config's evaluation:
every `eval.interval_s` (5 s) of wall time, `eval.episodes` (20) greedy episodes (deterministic actions: the
argmax of the categorical policy), episode j of evaluation i seeded seed + 10_000 + i * episodes + j as distrl's
evaluator seeds them; the score is the mean per-agent return (each agent's summed reward, averaged over the 3
agents and the episodes); solved at the first evaluation >= the target (-14, issue 53's, given to distrl's side
as `eval.target_return` where the config says otherwise), unsolved after the budget (600 s). BenchMARL's own
evaluation runs every `evaluation_interval` frames between iterations; this harness evaluates instead from a
BenchMARL callback after an optimizer step once the interval has passed since the end of the previous
evaluation (so the peer keeps an interval of training between two), on PettingZoo envs of its own, outside
BenchMARL's loggers. Every evaluation's [seconds since the start, return] is kept (`eval_curve`), so the time to
any other threshold can be read off; the summary gives -18, -16 and -14.

The env. BenchMARL's `pettingzoo/simple_spread` task builds TorchRL's `PettingZooEnv(task="simple_spread_v3")`,
which loads `pettingzoo.mpe.simple_spread_v3`; PettingZoo 1.25.0 is the last release that has `pettingzoo.mpe`
(1.26 removed it for the `mpe2` package), so the peer's venv pins it. distrl runs `mpe2:simple_spread_v3` (mpe2
1.1.1). The two agree: the scenario's reward (min distance to each landmark shared through local_ratio 0.5, -1
per collision), its observation (own velocity and position, landmarks and other agents relative, the others'
communication: 18 floats), the world's physics, N=3, max_cycles=25 and the 5 discrete actions are the same
code; what mpe2 adds (curriculum, terminate_on_success, partial observability, benchmark_data) is off by default,
and its other changed default (`dynamic_rescaling`) only draws. `--check-env` checks it: both packages reset
with the same seeds and driven by the same random actions give the same observations, rewards and dones.

BenchMARL's settings (`--settings benchmarl`, bench/results/benchmarl_mappo.json): its default yaml configs,
`algorithm/mappo.yaml` (shared centralised critic reading the env's global state, clip 0.2, no entropy bonus,
GAE lambda 0.9, l2 critic loss), `model/layers/mlp.yaml` for actor and critic (256x256, tanh),
`task/pettingzoo/simple_spread.yaml` and `experiment/base_experiment.yaml` (lr 5e-5, Adam eps 1e-6, gradient
norm clip 5, gamma 0.99, 6,000 frames per iteration from 10 envs, 45 epochs of 400-frame minibatches, parameter
sharing). Changed, and why:
- task `max_cycles` 100 -> 25: the task is simple_spread with 25-step episodes (distrl's and issue 53's);
- `prefer_continuous_actions` true -> false: the task has discrete actions;
- `max_n_frames` 3,000,000 -> none reached: the run stops at the wall-clock budget or the target;
- `evaluation` true -> false, `render` true -> false, `loggers` [csv, wandb] -> [], `create_json` true -> false:
  this harness evaluates on the clock (above) and writes its own JSON; no wandb here, no log files;
- `save_folder` -> a temporary folder (the default writes into the working directory);
- one torch thread (`torch.set_num_threads(1)`), as the SB3 peers: 2 cores shared with the env stepping
  (BenchMARL's collector steps its 10 envs in this process, one after the other: `parallel_collection` false).
Devices are BenchMARL's defaults (cpu).

`--settings same` (bench/results/benchmarl_mappo_same.json): BenchMARL's MAPPO with distrl's config's
hyperparameters, read from the config when the run starts: its num_envs x fragment_length frames per
iteration, its epochs and minibatches, lr, gamma, GAE lambda, entropy coefficient, clip, gradient norm clip,
value coefficient and MLP (hidden sizes, activation), and Adam's default eps (distrl's); BenchMARL keeps its
own loss, its state-reading critic and its separate actor and critic optimizers.
"""
from __future__ import annotations

import time

START = time.time()  # the child's clock: before any import, as distrl's cli starts its own

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from bench.peers.sb3_runs import EVAL_SEED_OFFSET, child_args, summarise  # noqa: E402  (stdlib only: any venv)

CONFIG = "configs/mappo_simple_spread.yaml"
TARGET = -14.0  # issue 53's
THRESHOLDS = (-18.0, -16.0, -14.0)
ENV_KWARGS = dict(N=3, local_ratio=0.5, max_cycles=25, continuous_actions=False)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEER_PYTHON = os.path.join(HERE, ".venv-benchmarl", "bin", "python")
PEER = "benchmarl"


# --- the peer (runs in bench/peers/.venv-benchmarl) ------------------------------------------------------------
class Stop(Exception):
    """Raised by the callback to end BenchMARL's loop: solved or out of time."""


def make_experiment(args, save_folder: str, callbacks: list):
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config.update(max_cycles=ENV_KWARGS["max_cycles"])  # 100 in BenchMARL's yaml
    assert task.config["N"] == ENV_KWARGS["N"] and task.config["local_ratio"] == ENV_KWARGS["local_ratio"]
    algorithm = MappoConfig.get_from_yaml()
    model = MlpConfig.get_from_yaml()
    critic_model = MlpConfig.get_from_yaml()
    cfg = ExperimentConfig.get_from_yaml()
    cfg.prefer_continuous_actions = False
    cfg.max_n_frames, cfg.max_n_iters = 10**12, None  # the budget or the target ends the run
    cfg.evaluation, cfg.render, cfg.loggers, cfg.create_json = False, False, [], False
    cfg.checkpoint_interval, cfg.checkpoint_at_end = 0, False
    cfg.save_folder = save_folder
    if args.settings == "same":
        same = json.loads(args.same)
        import torch

        cfg.on_policy_n_envs_per_worker = same["num_envs"]
        cfg.on_policy_collected_frames_per_batch = same["num_envs"] * same["fragment_length"]
        cfg.on_policy_minibatch_size = cfg.on_policy_collected_frames_per_batch // same["minibatches"]
        cfg.on_policy_n_minibatch_iters = same["epochs"]
        cfg.lr, cfg.gamma, cfg.adam_eps = same["lr"], same["gamma"], 1e-8  # torch's Adam default, distrl's
        cfg.clip_grad_norm, cfg.clip_grad_val = True, same["grad_clip"]
        algorithm.entropy_coef, algorithm.lmbda = same["ent_coef"], same["gae_lambda"]
        algorithm.clip_epsilon, algorithm.critic_coef = same["clip"], same["vf_coef"]
        activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "elu": torch.nn.ELU, "gelu": torch.nn.GELU,
                      "silu": torch.nn.SiLU}[same["activation"]]
        for m in (model, critic_model):
            m.num_cells, m.activation_class = list(same["hidden"]), activation
    return Experiment(task=task, algorithm_config=algorithm, model_config=model, critic_model_config=critic_model,
                      seed=args.seed, config=cfg, callbacks=callbacks)


def greedy_return(policy, envs, seed: int) -> float:
    """Mean per-agent return of one greedy episode per env (env i reset with seed + i): each agent's summed
    reward, averaged over agents and envs."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    names = envs[0].possible_agents
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns = np.zeros((len(envs), len(names)))
    running = np.ones(len(envs), bool)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        while running.any():
            rows = np.flatnonzero(running)
            x = torch.as_tensor(np.stack([[obs[i][a] for a in names] for i in rows]), dtype=torch.float32)
            td = TensorDict({"agent": TensorDict({"observation": x}, batch_size=x.shape[:2])}, batch_size=x.shape[:1])
            actions = policy(td)["agent", "action"].numpy()
            for row, i in enumerate(rows):
                obs[i], rewards, terms, truncs, _ = envs[i].step(dict(zip(names, actions[row].tolist())))
                returns[i] += [rewards[a] for a in names]
                running[i] = not (all(terms.values()) or all(truncs.values()))
    return float(returns.mean())


def make_solve(callback_class):
    """The evaluation on the clock, as a BenchMARL callback (a module-level class: BenchMARL pickles its
    callbacks; the envs are made at the first evaluation, after that)."""
    global Solve

    class Solve(callback_class):
        def __init__(self, args):
            super().__init__()
            self.args, self.envs = args, None
            self.evaluations, self.last_eval, self.best, self.solved_at = 0, START, float("-inf"), None
            self.curve, self.eval_s = [], 0.0  # [seconds since the start, mean return] of each evaluation
            self.train_curve = []  # [seconds, frames, BenchMARL's mean per-agent return of the batch's episodes]

        def check_budget(self):
            if time.time() - START >= self.args.budget_s:
                raise Stop("budget")

        def on_batch_collected(self, batch):
            e = self.experiment
            self.train_curve.append([time.time() - START, int(e.total_frames), float(e.mean_return)])
            self.check_budget()

        def on_train_step(self, batch, group):
            args = self.args
            self.check_budget()
            if time.time() - self.last_eval < args.interval_s:
                return None
            t0 = time.time()
            if self.envs is None:
                from pettingzoo.mpe import simple_spread_v3

                self.envs = [simple_spread_v3.parallel_env(**ENV_KWARGS) for _ in range(args.episodes)]
            seed = args.seed + EVAL_SEED_OFFSET + self.evaluations * args.episodes
            mean = greedy_return(self.experiment.policy, self.envs, seed)
            self.evaluations += 1
            self.last_eval = time.time()
            self.eval_s += self.last_eval - t0
            self.curve.append([self.last_eval - START, mean])
            self.best = max(self.best, mean)
            if mean >= args.target:
                self.solved_at = self.last_eval - START
                raise Stop("solved")
            return None

    Solve.__qualname__ = "Solve"
    return Solve


def child(args) -> None:
    """One BenchMARL run in this process; prints one JSON line."""
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import torch

    torch.set_num_threads(args.torch_threads)
    import benchmarl
    from benchmarl.experiment.callback import Callback

    solve = make_solve(Callback)(args)
    with tempfile.TemporaryDirectory(prefix="benchmarl-") as folder:
        experiment = make_experiment(args, folder, [solve])
        setup_s = time.time() - START
        try:
            experiment.run()
        except Stop:
            pass
    cfg = experiment.config
    print(json.dumps({
        "solved": solve.solved_at is not None, "time_to_solve_s": solve.solved_at,
        "best_eval_return": solve.best if solve.evaluations else None,
        "env_steps": int(experiment.total_frames),  # joint steps collected (frames), as distrl counts env steps
        "wall_s": time.time() - START, "evaluations": solve.evaluations, "iterations": experiment.n_iters_performed,
        "setup_s": setup_s, "eval_s": solve.eval_s, "benchmarl": benchmarl.__version__,
        "frames_per_iteration": cfg.on_policy_collected_frames_per_batch, "eval_curve": solve.curve,
        "train_curve": solve.train_curve}))


# --- the env check ----------------------------------------------------------------------------------------------
def env_trace(package: str, out: str, seeds=range(5)) -> None:
    """simple_spread from `package` (pettingzoo.mpe or mpe2), each seed's episode under seeded random actions:
    observations, rewards and dones, saved to `out` (.npz)."""
    import importlib
    import warnings

    import numpy as np

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    env = importlib.import_module(f"{package}.simple_spread_v3").parallel_env(**ENV_KWARGS)
    names = env.possible_agents
    obs_all, rew_all, done_all = [], [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        obs_all.append([obs[a] for a in names])
        for _ in range(ENV_KWARGS["max_cycles"]):
            obs, rew, term, trunc, _ = env.step({a: int(rng.integers(env.action_space(a).n)) for a in names})
            obs_all.append([obs[a] for a in names])
            rew_all.append([rew[a] for a in names])
            done_all.append([[term[a], trunc[a]] for a in names])
    np.savez(out, obs=np.array(obs_all), rew=np.array(rew_all), done=np.array(done_all),
             obs_space=str(env.observation_space(names[0])), act_space=str(env.action_space(names[0])))


def check_env() -> None:
    import numpy as np

    with tempfile.TemporaryDirectory() as d:
        ours, peer = os.path.join(d, "mpe2.npz"), os.path.join(d, "pz.npz")
        env_trace("mpe2", ours)
        subprocess.run([PEER_PYTHON, "-c", f"from bench.peers.benchmarl_mappo import env_trace; "
                        f"env_trace('pettingzoo.mpe', {peer!r})"], check=True, cwd=ROOT)
        a, b = np.load(ours), np.load(peer)
        for key in ("obs_space", "act_space"):
            print(f"{key}: mpe2 {a[key]}, pettingzoo.mpe {b[key]}")
            assert str(a[key]) == str(b[key])
        for key in ("obs", "rew", "done"):
            assert a[key].shape == b[key].shape and np.array_equal(a[key], b[key]), key
            print(f"{key}: {a[key].shape} identical")
        print(f"mpe2:simple_spread_v3 and pettingzoo.mpe.simple_spread_v3 agree ({ENV_KWARGS})")


# --- the driver (runs in distrl's venv) -------------------------------------------------------------------------
def first_reaching(curve: list, threshold: float):
    return next((t for t, r in curve if r >= threshold), None)


def table(runs: list[dict]) -> str:
    def s(x):
        return "-" if x is None else f"{x:.1f}"

    lines = ["| side | seed | solved | time to target (s) | first >= -18 / -16 / -14 (s) | best return | env steps | "
             "evaluations |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["side"], r["seed"])):
        firsts = " / ".join(s(first_reaching(r.get("eval_curve") or [], th)) for th in THRESHOLDS)
        lines.append(f"| {r['side']} | {r['seed']} | {r['solved']} | {s(r['time_to_solve_s'])} | {firsts} | "
                     f"{s(r['best_eval_return'])} | {r['env_steps']} | {r.get('evaluations', len(r.get('eval_curve') or []))} |")
    return "\n".join(lines)


def same_settings(cfg) -> dict:
    """distrl's config's hyperparameters, for `--settings same`."""
    m = cfg.mappo
    return {"num_envs": cfg.env.num_envs, "fragment_length": cfg.rollout.fragment_length, "epochs": m.epochs,
            "minibatches": m.minibatches, "lr": m.lr, "gamma": m.gamma, "gae_lambda": m.gae_lambda,
            "ent_coef": m.ent_coef, "clip": m.clip, "grad_clip": m.grad_clip, "vf_coef": m.vf_coef,
            "hidden": list(cfg.model.hidden), "activation": cfg.model.activation}


def main() -> None:
    from bench.common import hardware, write_json
    from bench.solve import solve_once
    from distrl.config import load_config
    from distrl.roles.evaluation import EVAL_SEED_OFFSET as distrl_offset

    assert EVAL_SEED_OFFSET == distrl_offset, "the child must seed its evaluations as distrl's evaluator does"
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget-s", type=float, default=600.0)
    ap.add_argument("--target", type=float, default=TARGET)
    ap.add_argument("--settings", choices=["benchmarl", "same"], default="benchmarl")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--no-ours", action="store_true", help="the peer only")
    ap.add_argument("--no-peer", action="store_true", help="distrl only")
    ap.add_argument("--lock", help="run each run under `flock LOCK` (a machine shared with other heavy jobs)")
    ap.add_argument("--out", help="default: bench/results/benchmarl_mappo.json (_same.json with --settings same)")
    args = ap.parse_args()
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   "benchmarl_mappo.json" if args.settings == "benchmarl" else "benchmarl_mappo_same.json")
    cfg = load_config(os.path.join(ROOT, CONFIG))
    budget, prefix = args.budget_s, (("flock", args.lock) if args.lock else ())
    ours_overrides = ["log.tensorboard=false"]
    if cfg.eval.target_return != args.target:
        ours_overrides.append(f"eval.target_return={args.target}")
    same = same_settings(cfg)
    sides = [s for s, skip in (("distrl", args.no_ours), (PEER, args.no_peer)) if not skip]
    old = json.load(open(out))["runs"] if os.path.exists(out) else []
    runs = [r for r in old if not (r["side"] in sides and r["seed"] in args.seeds)]
    hw = hardware()

    def save():
        if runs:
            runs[-1].setdefault("commit", hw["commit"])
            runs[-1].setdefault("cpu", hw["cpu"])
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "eval_curve"}), flush=True)
        summary = summarise(runs, budget)
        for side in summary:
            rs = [r for r in runs if r["side"] == side]
            summary[side]["per_seed_first_reaching_s"] = {
                str(th): [first_reaching(r.get("eval_curve") or [], th) for r in rs] for th in THRESHOLDS}
            summary[side]["seeds"] = [r["seed"] for r in rs]
        if {"distrl", PEER} <= summary.keys():
            p, o = summary[PEER], summary["distrl"]
            if p["median_time_to_solve_s"] is not None and o["median_time_to_solve_s"] is not None:
                summary["ratio_benchmarl_over_distrl"] = p["median_time_to_solve_s"] / o["median_time_to_solve_s"]
            else:  # an unsolved seed counted as the budget: a lower bound if only the peer left seeds unsolved
                summary["ratio_unsolved_as_budget"] = p["median_unsolved_as_budget_s"] / o["median_unsolved_as_budget_s"]
        results = {"hardware": hw, "config": CONFIG, "env": cfg.env.id, "peer_env": "pettingzoo.mpe.simple_spread_v3",
                   "env_kwargs": ENV_KWARGS, "budget_s": budget, "target_return": args.target,
                   "eval": {"interval_s": cfg.eval.interval_s, "episodes": cfg.eval.episodes},
                   "peer_settings": {"settings": args.settings, "torch_threads": args.torch_threads,
                                     **({"distrl_hyperparameters": same} if args.settings == "same" else {})},
                   "distrl_overrides": ours_overrides, "runs": runs, "summary": summary}
        write_json(out, results)
        return results

    for seed in args.seeds:
        if "distrl" in sides:  # alternating: both sides see the same machine load
            r = solve_once(CONFIG, cfg.mode, seed, cfg.workers, budget, ours_overrides, prefix=prefix)
            runs.append({"side": "distrl", "seed": seed, **{k: r[k] for k in (
                "solved", "time_to_solve_s", "best_eval_return", "env_steps", "wall_s", "mode", "workers", "eval_curve")}})
            save()
        if PEER in sides:
            cmd = [*prefix, PEER_PYTHON, "-m", "bench.peers.benchmarl_mappo", "--child", str(seed), str(budget),
                   "--interval-s", str(cfg.eval.interval_s), "--episodes", str(cfg.eval.episodes),
                   "--target", str(args.target), "--settings", args.settings, "--torch-threads", str(args.torch_threads),
                   "--same", json.dumps(same)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
            if proc.returncode != 0:
                raise SystemExit(f"BenchMARL run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
            runs.append({"side": PEER, "seed": seed, **json.loads(proc.stdout.strip().splitlines()[-1])})
            save()
    save()
    print(table(runs))


if __name__ == "__main__":
    if "--child" in sys.argv:
        child(child_args({"--settings": dict(choices=["benchmarl", "same"], default="benchmarl"),
                          "--torch-threads": dict(type=int, default=1), "--same": dict(default="{}")}))
    elif "--check-env" in sys.argv:
        check_env()
    else:
        main()
