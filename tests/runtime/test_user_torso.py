"""A user's own network (`model.torso: module:Factory`) through the real path: it learns in single
mode, reaches every Ray actor in sync mode (workers load its weights strictly, so any other network
would fail), and a run resumes with it from a checkpoint."""
import os

import pytest
from safetensors.numpy import load_file

from distrl import resume, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORSO = ["model.torso=tests.runtime.custom_torso:LayerNormTorso", "model.kwargs={width: 40}"]
QUIET = ["log.progress=false", "log.tensorboard=false"]


def config(name: str) -> str:
    return os.path.join(ROOT, "configs", f"{name}.yaml")


def torso_keys(run_dir: str) -> set[str]:
    """Names of the torso parameters in the run's best weights (those the evaluator and workers acted with)."""
    weights = load_file(os.path.join(run_dir, "checkpoints", "best.safetensors"))
    return {k for k in weights if "torso" in k}


# Single mode's evaluator runs beside the learner, so under load it scores weights some steps late: the
# budgets leave that lag room (seed 0 reaches 475 at 94k env steps with Ape-X when nothing else runs).
@pytest.mark.parametrize("name, budget", [("ppo_cartpole", 60_000), ("apex_dqn_cartpole", 200_000)])
def test_a_user_torso_learns_cartpole_in_single_mode(tmp_path, name, budget):
    summary = train(config(name), run_dir=str(tmp_path / "run"), overrides=[
        "mode=single", "seed=0", f"stop.max_env_steps={budget}", "stop.max_seconds=120", *TORSO, *QUIET])
    assert summary["solved"] and summary["best_eval_return"] >= 475, summary
    keys = torso_keys(str(tmp_path / "run"))
    assert any(k.endswith("body.2.weight") for k in keys), keys  # the LayerNorm: the user's network
    widths = [w.shape[0] for k, w in load_file(os.path.join(tmp_path, "run", "checkpoints", "best.safetensors")).items()
              if k.endswith("body.1.weight")]  # Linear (out, in): model.kwargs reached the factory
    assert widths and set(widths) == {40}


# PPO: Ape-X builds the same torso in the learner and evaluator (its learning and resume tests above).
@pytest.mark.parametrize("name", ["ppo_cartpole"])
def test_a_user_torso_reaches_every_actor_in_sync_mode(ray_session, tmp_path, name):
    run_dir = str(tmp_path / "run")
    summary = train(config(name), run_dir=run_dir, overrides=[
        "mode=sync", "workers=2", "stop.max_env_steps=4000", "eval.target_return=null", "eval.interval_s=0.5",
        "eval.episodes=2", *TORSO, *QUIET])
    assert summary["stop_reason"] == "max_env_steps" and summary["updates"] > 0
    assert summary["worker_restarts"] == 0 and summary["best_eval_return"] is not None
    assert any(k.endswith("body.2.weight") for k in torso_keys(run_dir))


def test_a_run_with_a_user_torso_resumes(tmp_path):
    run_dir = str(tmp_path / "run")
    first = train(config("apex_dqn_cartpole"), run_dir=run_dir, overrides=[
        "mode=single", "stop.max_env_steps=4000", "eval.target_return=null", *TORSO, *QUIET])
    assert first["stop_reason"] == "max_env_steps"
    second = resume(run_dir, overrides=["stop.max_env_steps=8000"])
    assert second["stop_reason"] == "max_env_steps" and second["env_steps"] >= 8000
    assert second["updates"] > first["updates"]
    assert any(k.endswith("body.2.weight") for k in torso_keys(run_dir))


@pytest.mark.parametrize("torso, says", [
    ("tests.runtime.no_such_module:Factory", "cannot import 'tests.runtime.no_such_module:Factory'"),
    ("tests.runtime.custom_torso:raising", "raised RuntimeError: no GPU kernel for this layer"),
    ("tests.runtime.custom_torso:WrongWidth", "must map observations shaped (2, 4) to float features shaped (2, 49)"),
    ("tests.runtime.custom_torso:not_a_module", "must return an nn.Module with an int out_features"),
    ("tests.runtime.custom_torso:np", "is not callable"),
])
def test_a_broken_user_torso_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, torso, says):
    from distrl.cli import main

    code = main(["train", config("ppo_cartpole"), "--run-dir", str(tmp_path / "run"),
                 "--set", f"model.torso={torso}", "--set", "model.kwargs={width: 48}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("distrl: error: config key 'model.torso':") and says in err[0], err
    assert not (tmp_path / "run").exists()
