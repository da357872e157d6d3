"""log.wandb and log.mlflow with no network: a run logs to W&B offline and to an MLflow file store, and what
each library reads back (wandb's own `wandb leet inspect`, MLflow's client) matches the run's config.yaml,
metrics.csv, learner.jsonl and summary.json; the best checkpoint is an artifact of both."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from distrl.cli import main
from distrl.observe.trackers import flatten

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "ppo_cartpole.yaml")


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One PPO run logging to both trackers (W&B's files kept inside the test's directory)."""
    from distrl.api import train

    base = tmp_path_factory.mktemp("trackers")
    env = {"WANDB_DATA_DIR": base / "wandb-data", "WANDB_CACHE_DIR": base / "wandb-cache",
           "WANDB_CONFIG_DIR": base / "wandb-config"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    run_dir, uri = str(base / "run"), f"file:{base / 'mlruns'}"
    try:
        summary = train(CONFIG, run_dir=run_dir, overrides=[
            "stop.max_env_steps=1024", "log.interval_steps=256", "eval.interval_steps=256", "eval.episodes=2",
            "eval.target_return=null", "log.progress=false", "log.tensorboard=false",
            "log.wandb={project: distrl-test, mode: offline, tags: [ci]}", f"log.mlflow={{tracking_uri: '{uri}'}}"])
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(os.path.join(run_dir, "learner.jsonl")) as fh:
        learner = [json.loads(line) for line in fh]
    with open(os.path.join(run_dir, "config.yaml")) as fh:
        config = yaml.safe_load(fh)
    return {"run_dir": run_dir, "uri": uri, "summary": summary, "rows": rows, "learner": learner, "config": config}


def _numbers(row: dict) -> dict[str, float]:
    out = {}
    for k, v in row.items():
        try:
            if v != "" and math.isfinite(float(v)):
                out[k] = float(v)
        except (TypeError, ValueError):
            pass
    return out


def _no_empty(d):
    """W&B leaves empty mappings out of a run's config."""
    if isinstance(d, dict):
        return {k: _no_empty(v) for k, v in d.items() if v != {}}
    return d


def _leet(path: str, *flags: str) -> str:
    wandb = os.path.join(os.path.dirname(sys.executable), "wandb")
    return subprocess.run([wandb, "leet", "inspect", "--json", *flags, path], capture_output=True, text=True,
                          check=True, timeout=120).stdout


def test_wandb_offline_run_holds_the_config_every_row_and_the_summary(tracked_run):
    run = os.path.join(tracked_run["run_dir"], "wandb", "latest-run")
    overview = json.loads(_leet(run, "--summary"))
    assert overview["project"] == "distrl-test" and overview["tags"] == ["ci"]
    assert overview["config"] == _no_empty(json.loads(json.dumps(tracked_run["config"])))
    records = [json.loads(line) for line in _leet(run).splitlines() if line.strip()]
    history = [r["history"]["item"] for r in records if r.get("type") == "history"]
    assert len(history) == len(tracked_run["rows"]) >= 4
    for logged, row, diag in zip(history, tracked_run["rows"], tracked_run["learner"]):
        assert {k: logged[k] for k in _numbers(row)} == pytest.approx(_numbers(row))
        assert {k: logged[f"learner/{k}"] for k in diag if k not in row} == pytest.approx(
            {k: v for k, v in diag.items() if k not in row})
    summary = tracked_run["summary"]
    assert {k: overview["summary"].get(k) for k in summary} == json.loads(json.dumps(summary))
    artifacts = [r for r in records if r.get("type") == "artifact"]
    assert len(artifacts) == 1 and "best.safetensors" in json.dumps(artifacts[0])
    assert overview["exit_code"] == 0 and overview["state"] == "finished"


def test_mlflow_file_store_run_holds_the_config_every_row_and_the_summary(tracked_run, tmp_path):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    with open(os.path.join(tracked_run["run_dir"], "trackers.json")) as fh:
        run_id = json.load(fh)["mlflow"]["run_id"]
    client = MlflowClient(tracking_uri=tracked_run["uri"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {k: str(v) for k, v in flatten(tracked_run["config"]).items()}
    rows = tracked_run["rows"]
    for key in ("env_steps", "updates", "eval_return_mean", "best_eval_return", "wall_s"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        want = sorted((int(r["env_steps"]), float(r[key])) for r in rows if r[key] != "")
        assert [s for s, _ in history] == [s for s, _ in want] and len(want) >= 4
        assert [v for _, v in history] == pytest.approx([v for _, v in want])
    diag = tracked_run["learner"]
    history = [m.value for m in client.get_metric_history(run_id, "learner/entropy")]
    assert sorted(history) == pytest.approx(sorted(d["entropy"] for d in diag))
    summary = client.download_artifacts(run_id, "summary.json", str(tmp_path))
    with open(summary) as fh:
        assert json.load(fh) == json.loads(json.dumps(tracked_run["summary"]))
    assert run.data.tags["summary.stop_reason"] == "max_env_steps"
    assert run.data.metrics["summary/env_steps"] == tracked_run["summary"]["env_steps"]
    stored = {a.path: a.file_size for a in client.list_artifacts(run_id, "checkpoints")}
    best = os.path.join(tracked_run["run_dir"], "checkpoints", "best.safetensors")
    assert stored["checkpoints/best.safetensors"] == os.path.getsize(best)


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_a_tracker_that_is_not_installed_is_one_line(tmp_path, capsys, monkeypatch, tracker):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == tracker else real(name, *a))
    run_dir = tmp_path / "run"
    assert main(["train", CONFIG, "--set", f"log.{tracker}={{}}", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"config key 'log.{tracker}': {tracker} is not installed" in err and err.count("\n") == 1
    assert not run_dir.exists()


def test_an_mlflow_database_store_without_sqlalchemy_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sqlalchemy" else real(name, *a))
    run_dir = tmp_path / "run"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["train", CONFIG, "--set", f"log.mlflow={{tracking_uri: '{uri}'}}", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"config key 'log.mlflow.tracking_uri': {uri} is a database store" in err and err.count("\n") == 1
    assert "pip install mlflow" in err and not run_dir.exists()


def test_an_unknown_tracker_key_is_one_line(tmp_path, capsys):
    assert main(["train", CONFIG, "--set", "log.wandb={projekt: x}", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'log.wandb.projekt'" in err and err.count("\n") == 1
