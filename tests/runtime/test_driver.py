"""The driver's wind-down after a fault that no recovery covers, in single mode (no Ray): the run still
ends with a checkpoint, summary.json naming the cause in one line, and the traceback in failure.log."""
import json
import os

from distrl import train
from distrl.runtime.local import LocalRoles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def test_an_unexpected_error_ends_the_run_with_a_checkpoint_a_summary_and_the_traceback(tmp_path, monkeypatch):
    real_train, calls = LocalRoles.train, []

    def train_then_fail(self, budget, final=False):
        calls.append(budget)
        if len(calls) == 30:
            raise ValueError("a bug in the learner\nsecond line")
        return real_train(self, budget, final)

    monkeypatch.setattr(LocalRoles, "train", train_then_fail)
    run_dir = str(tmp_path / "run")
    summary = train(CARTPOLE, run_dir=run_dir, overrides=[
        "mode=single", "stop.max_env_steps=100000", "log.progress=false", "log.tensorboard=false"])
    assert summary["stop_reason"] == "error"
    assert summary["failure"] == "stopped: a bug in the learner (traceback in failure.log)"
    assert json.load(open(os.path.join(run_dir, "summary.json")))["stop_reason"] == "error"
    log = open(os.path.join(run_dir, "failure.log")).read()
    assert "Traceback" in log and "ValueError: a bug in the learner" in log and "train_then_fail" in log
    done = [d for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.startswith("ckpt-")]
    assert done and all(os.path.exists(os.path.join(run_dir, "checkpoints", d, "DONE")) for d in done)
