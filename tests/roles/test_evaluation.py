"""The evaluator's best checkpoint: ranked by success rate before return, and it only improves."""
import json
import os

from distrl.checkpoint import save_json
from distrl.roles.evaluation import LOWEST, _saved_rank, rank


def result(ret, success=None):
    metrics = {} if success is None else {"success_rate": success}
    return {"return_mean": ret, "metrics": metrics}


def test_success_rate_outranks_return_where_the_env_reports_one():
    assert rank(result(-20.0, success=0.9)) > rank(result(-5.0, success=0.8))
    assert rank(result(-5.0, success=0.9)) > rank(result(-20.0, success=0.9))
    assert rank(result(200.0)) > rank(result(100.0))


def test_a_restarted_evaluator_starts_from_the_saved_best(tmp_path):
    os.makedirs(tmp_path / "checkpoints")
    assert _saved_rank(str(tmp_path)) == LOWEST
    save_json(os.path.join(tmp_path, "checkpoints", "best.json"), result(-7.0, success=0.85))
    assert _saved_rank(str(tmp_path)) == (0.85, -7.0)
    with open(tmp_path / "checkpoints" / "best.json", "w") as fh:
        json.dump({"return_mean": float("nan"), "metrics": {}}, fh)
    assert _saved_rank(str(tmp_path)) == LOWEST
    with open(tmp_path / "checkpoints" / "best.json", "w") as fh:
        fh.write("{half")
    assert _saved_rank(str(tmp_path)) == LOWEST
