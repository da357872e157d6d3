"""What `distrl eval/export/record` play: a run's best checkpoint, or, in a run none of whose evaluations
finished, its newest checkpoint's learner weights (said in one line)."""
import os

import numpy as np
import onnxruntime as ort
import pytest

from distrl import train
from distrl.api import _run_config, _run_policy
from distrl.cli import main
from distrl.checkpoint.read import load_latest, read_checkpoint
from distrl.envs.normalize import Normalization

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["mode=single", "seed=0", "log.progress=false", "log.tensorboard=false", "eval.target_return=null"]


@pytest.mark.parametrize("config, network, extra", [
    ("apex_dqn_cartpole", "q", ["stop.max_env_steps=2000", "replay.min_size=500"]),
    ("ppo_cartpole", "net", ["stop.max_env_steps=1024", "env.normalize.obs=true"]),
])
def test_a_run_without_a_best_checkpoint_plays_its_newest_checkpoints_weights(tmp_path, capsys, config, network,
                                                                              extra):
    run_dir = str(tmp_path / "run")
    summary = train(os.path.join(ROOT, "configs", f"{config}.yaml"), run_dir=run_dir, overrides=[*QUIET, *extra])
    for name in ("best.safetensors", "best.json"):  # as if the run had ended before an evaluation finished
        if os.path.exists(os.path.join(run_dir, "checkpoints", name)):
            os.remove(os.path.join(run_dir, "checkpoints", name))
    path, state = load_latest(run_dir, read_checkpoint)
    learner = state["learner"]
    assert learner["version"] == summary["updates"] > 0
    capsys.readouterr()

    assert main(["eval", run_dir, "--episodes", "2"]) == 0
    out, err = capsys.readouterr()
    assert f"(checkpoint version {learner['version']})" in out
    assert err.strip() == (f"distrl: warning: {run_dir} has no best checkpoint (no evaluation finished): using the "
                           f"weights of its newest checkpoint, {os.path.basename(path)} "
                           f"(version {learner['version']})")

    cfg = _run_config(run_dir)
    policy, weights, meta = _run_policy(run_dir, cfg)
    assert meta == {"version": learner["version"], "checkpoint": path}
    params = learner["state"][network]
    assert set(weights) == set(params) | set(learner["statistics"])  # the network and the run's statistics
    for k, v in params.items():
        np.testing.assert_array_equal(weights[k], v.numpy())
    for k, v in learner["statistics"].items():
        np.testing.assert_array_equal(weights[k], v.numpy())
    assert bool(learner["statistics"]) == ("env.normalize.obs=true" in extra)

    onnx = str(tmp_path / "policy.onnx")
    assert main(["export", run_dir, "--onnx", onnx]) == 0
    obs = np.random.default_rng(0).normal(0.0, 0.5, (16, 4)).astype(np.float32)
    got = ort.InferenceSession(onnx).run(["action"], {"obs": obs})[0]
    if learner["statistics"]:  # the file normalizes raw observations with the run's statistics
        normalization = Normalization(cfg.env.normalize, training=False)
        normalization.load(weights)
        obs = normalization.normalize(obs)
    np.testing.assert_array_equal(got, policy.act(obs, explore=False)[0])
    assert "no best checkpoint" in capsys.readouterr().err


def test_a_run_with_neither_a_best_nor_a_whole_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("algo: apex_dqn\n")
    for command in (["eval"], ["export", "--onnx", str(tmp_path / "x.onnx")]):
        assert main([command[0], str(run_dir), *command[1:]]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"distrl: error: {run_dir}/checkpoints/best.safetensors not found (no evaluation of the run "
                       f"finished) and no usable checkpoint in {run_dir}/checkpoints")
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("config", ["apex_dqn_cartpole", "ppo_cartpole", "impala_cartpole", "sac_pendulum",
                                    "r2d2_position_only_cartpole", "dhc_mapf_8x8", "cql_pendulum", "bc_cartpole"])
def test_every_algorithms_newest_checkpoint_gives_back_its_learners_weights(tmp_path, capsys, config):
    """The learner's state as its loop checkpoints it, written as a run's checkpoint, loads back into a learner
    built from the run's config.yaml: the weights played are the saved learner's, not a fresh one's."""
    import torch

    from distrl.checkpoint.run import write_checkpoint
    from distrl.config import dump_yaml, load_config
    from distrl.roles.factory import make_algorithm
    from distrl.roles.learning import LocalIO
    from distrl.runtime.pacing import learner_loop

    cfg = load_config(os.path.join(ROOT, "configs", f"{config}.yaml"))
    learner = make_algorithm(cfg).make_learner("cpu")
    torch.manual_seed(1)
    with torch.no_grad():  # weights no freshly built learner has
        for v in learner.weight_tensors().values():
            if v.is_floating_point():
                v.add_(0.1 * torch.randn_like(v))
    state = learner_loop(learner, cfg.algo, cfg.learner, LocalIO(None, None)).get_state()
    run_dir = str(tmp_path / "run")
    write_checkpoint(run_dir, {"meta": {}, "learner": state, "store": None, "workers": [], "torch_rng": None,
                               "numpy_rng": None})
    (tmp_path / "run" / "config.yaml").write_text(dump_yaml(cfg))
    _, weights, meta = _run_policy(run_dir, cfg)
    want = learner.get_weights()
    assert set(weights) == set(want) and meta["version"] == state["version"]
    for k, v in want.items():
        np.testing.assert_array_equal(weights[k], v)
    assert "no best checkpoint" in capsys.readouterr().err
