"""A run learns from simulators whose observation is a Dict (a Discrete cue, a nested Tuple, an action mask)
exactly as from the gymnasium env: one simulator process in remote inference, one in local inference (the
ONNX file takes one input per leaf, the mask among them); over every step they took, no action the mask
forbade."""
from distrl.api import train
from tests.runtime.test_external import result, simulator

ENV = "tests.runtime.masked_cue:MaskedCue"


def test_ppo_learns_a_masked_dict_observation_from_remote_and_local_simulators(tmp_path):
    """Greedy 7.5 of 8 (20 episodes) in the step budget: random legal actions return 3.75, and the trap the mask
    forbids would pay 2 a step. The clients play until the run ends (its time limit only against a hang)."""
    run_dir = str(tmp_path / "run")
    sims = [simulator(run_dir, 300, 1, "--env", ENV, "--reconnect", "2"),
            simulator(run_dir, 300, 2, "--env", ENV, "--reconnect", "2", "--inference", "local",
                      "--weights-interval", "0.5")]
    try:
        summary = train(None, run_dir=run_dir, overrides=[
            "algo=ppo", "mode=single", "seed=0", f"env.id={ENV}", "external.enabled=true", "env.num_envs=4",
            "rollout.fragment_length=32", "model.hidden=[32]", "ppo.lr=0.003", "ppo.epochs=4", "ppo.minibatches=2",
            "eval.target_return=7.5", "eval.episodes=20", "eval.interval_s=1", "stop.max_env_steps=40000",
            "stop.max_seconds=200", "log.progress=false", "log.tensorboard=false"])
    finally:
        outs = [result(p) for p in sims]
    assert summary["solved"] and summary["best_eval_return"] >= 7.5, summary
    ext = summary["external"]
    assert ext["connections"] == 2 and ext.get("errors", 0) == 0 and ext["steps"] >= summary["env_steps"], ext
    for out in outs:  # each simulator checked every action it got against its observation's mask
        assert out["steps"] > 0 and out["masked_actions"] == 0, out
