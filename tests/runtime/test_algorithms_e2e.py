"""Every algorithm end to end in every mode it supports, through the real path (Ray actors in sync/async)."""
import json
import os

import pytest

from distrl import train
from distrl.cli import main
from distrl.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIET = ["log.progress=false", "log.tensorboard=false", "eval.interval_s=0.5", "eval.episodes=2"]

# Pairs other Ray tests run end to end with these checks are left out: a3c async with its default bound
# (tests/runtime/test_onpolicy_learning.py), ppo sync (test_trace.py, test_user_torso.py), r2d2 sync
# (test_recurrent.py) and dhc async (tests/algos/test_dhc_structured.py, central inference); sac sync and
# impala sync take the sync paths of apex_dqn (flat replay, test_modes.py) and ppo (trajectories) with their
# own learners, which their async cases and learning tests run. SAC's flat observation through Ray is in
# test_inference.py and test_modes.py's Ape-X; its case here has a Dict one. Many workers into one replay
# server is test_modes.py's: the replay cases here run one.
CASES = [  # (config, mode, extra overrides)
    ("a2c_cartpole", "sync", []), ("ppo_cartpole", "async", []),
    ("impala_cartpole", "async", []),
    ("ppo_cartpole", "single", []), ("a3c_cartpole", "single", []),
    ("a3c_cartpole", "async", ["a3c.max_staleness=0"]),
    # a Dict observation of vector leaves through the replay server, the learner and the evaluator
    ("sac_pendulum", "async", ["replay.samples_per_insert=32", "replay.min_size=500", "workers=1",
                               "env.id=distrl.envs.testing:DictPendulum-v1"]),
    ("r2d2_position_only_cartpole", "async", ["replay.min_size=50", "workers=1"]),
    ("dhc_mapf_8x8", "sync", ["replay.min_size=50", "workers=1"]),
]


@pytest.mark.parametrize("config, mode, extra", CASES,
                         ids=[f"{c}-{m}" + ("-dict" if any("Dict" in e for e in x) else "") for c, m, x in CASES])
def test_algorithm_mode_end_to_end(request, tmp_path, config, mode, extra):
    if mode != "single":
        request.getfixturevalue("ray_session")
    run_dir = str(tmp_path / "run")
    # Single mode's 3,000 steps end within ~2 s, and its evaluator's first start (with its fork server's,
    # beside the suite's other process) can outlast the wind-down that waits for it: more steps, one score.
    steps = 12_000 if mode == "single" else 3000
    summary = train(os.path.join(ROOT, "configs", f"{config}.yaml"), run_dir=run_dir, overrides=[
        f"mode={mode}", "workers=2", f"stop.max_env_steps={steps}", "eval.target_return=null", *QUIET, *extra])
    assert summary["mode"] == mode and summary["stop_reason"] == "max_env_steps"
    assert summary["updates"] > 0 and summary["best_eval_return"] is not None
    assert json.load(open(os.path.join(run_dir, "summary.json")))["updates"] == summary["updates"]
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    if config.startswith("sac"):  # SAC's temperature and entropy reach learner.jsonl
        last = json.loads(open(os.path.join(run_dir, "learner.jsonl")).read().splitlines()[-1])
        assert 0.0 < last["alpha"] < 1.0 and "entropy" in last and "q_mean" in last
    if config.startswith("a3c"):
        check_a3c_staleness(run_dir, summary, mode)
    replay = summary["rate_limiter"].get("samples_per_insert") is not None
    if replay:
        check_ratio(summary, load_config(os.path.join(run_dir, "config.yaml")))
    # A replay reports what it really holds per item; an on-policy FIFO holds nothing between updates.
    if replay:
        assert summary["replay_bytes_per_item"] > 0
    else:
        assert summary["replay_bytes_per_item"] is None


def check_ratio(summary, cfg):
    """Replay algorithms (items are transitions or sequences): every sampled item is a batch row, the
    learner never ran ahead of the ratio by more than the error buffer, and it did not start before
    min_size items were stored."""
    rl = summary["rate_limiter"]
    assert rl["samples"] == summary["updates"] * cfg.learner.batch_size, rl
    assert rl["inserts"] >= cfg.replay.min_size, rl
    owed = rl["samples_per_insert"] * (rl["inserts"] - cfg.replay.min_size)
    assert rl["samples"] - owed <= rl["error_buffer"], rl
    assert rl["samples"] > 0 and rl["samples_per_insert_observed"] is not None


def check_a3c_staleness(run_dir, summary, mode):
    """Single mode: every gradient comes from the newest weights. Async with max_staleness 0: gradients
    from older weights were recorded and dropped, and every applied one had staleness 0."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "learner.jsonl"))]
    applied = [r["staleness_applied"] for r in rows if "staleness_applied" in r]
    assert applied
    if mode == "single":
        assert summary["gradients_dropped"] == 0 and summary["policy_lag"]["max"] == 0
        assert max(applied) == 0
    else:
        assert summary["policy_lag"]["max"] > 0 and summary["gradients_dropped"] > 0
        assert max(applied) == 0.0  # means of non-negative stalenesses: 0 only if each was 0


@pytest.mark.parametrize("algo, mode, supported", [("a2c", "async", "single, sync"), ("a3c", "sync", "single, async")])
def test_unsupported_mode_is_a_clear_error(capsys, tmp_path, algo, mode, supported):
    code = main(["train", os.path.join(ROOT, "configs", f"{algo}_cartpole.yaml"), "--mode", mode,
                 "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == f"distrl: error: config key 'mode': {algo} does not support mode '{mode}' (supported: {supported})"
    assert not (tmp_path / "run").exists()
