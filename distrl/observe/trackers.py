"""Experiment trackers: Weights & Biases (`log.wandb`) and MLflow (`log.mlflow`).

Each gets the resolved config when the run starts, every metrics.csv row (with the learner's diagnostics
as `learner/<name>`) as it is written, the evaluation videos, and at the end the summary and the best
checkpoint (`checkpoints/best.safetensors` and `best.json`) as an artifact. Both work with no network:
wandb in `mode: offline` (the run is kept under RUN_DIR/wandb/, `wandb sync` uploads it later), MLflow with
a local store (`tracking_uri: file:/abs/mlruns` or `sqlite:////abs/mlflow.db`). A resumed run logs to the
same tracker run (its id is kept in RUN_DIR/trackers.json).

A tracker never ends a run: one that fails (a network error, a full disk) prints one warning and is
dropped for the rest of the run.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import time

from distrl.config import ConfigError

IDS_FILE = "trackers.json"  # RUN_DIR/trackers.json: each tracker's run id, for a resumed run
BEST_FILES = ("best.safetensors", "best.json")
MLFLOW_PARAM_MAX = 6000  # MLflow keeps at most this many characters of a param value
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}


DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQL stores: they need SQLAlchemy


def check_installed(log_cfg) -> None:
    """ConfigError naming the key when the config asks for a tracker whose package is not installed, or
    for an MLflow database store without SQLAlchemy (the `mlflow` extra installs the client, mlflow-skinny,
    which logs to a file store or a tracking server)."""
    for name, module in PACKAGES.items():
        if getattr(log_cfg, name, None) is not None and importlib.util.find_spec(module) is None:
            raise ConfigError(f"config key 'log.{name}': {module} is not installed (pip install -e '.[{name}]')")
    uri = str((getattr(log_cfg, "mlflow", None) or {}).get("tracking_uri") or "")
    if uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES and importlib.util.find_spec("sqlalchemy") is None:
        raise ConfigError(f"config key 'log.mlflow.tracking_uri': {uri} is a database store, which needs "
                          "MLflow's server package (pip install mlflow)")


def _numbers(values: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of `values` (None, NaN and text left out), keys prefixed."""
    out = {}
    for k, v in values.items():
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[prefix + k] = v
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    """{"ppo": {"lr": 1e-3}} -> {"ppo.lr": 1e-3}; mappings the config takes whole (env.kwargs) stay values."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k not in ("kwargs",):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _read_ids(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, IDS_FILE)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _write_ids(run_dir: str, name: str, value: dict) -> None:
    ids = _read_ids(run_dir)
    ids[name] = value
    tmp = os.path.join(run_dir, IDS_FILE + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(ids, fh)
    os.replace(tmp, os.path.join(run_dir, IDS_FILE))


def _best_files(run_dir: str) -> list[str]:
    paths = [os.path.join(run_dir, "checkpoints", name) for name in BEST_FILES]
    return [p for p in paths if os.path.isfile(p)]


def _run_name(run_dir: str) -> str:
    return os.path.basename(os.path.normpath(run_dir))


class WandbTracker:
    """A W&B run: config, one history row per metrics row (x axis: env_steps), summary, best checkpoint."""

    name = "wandb"

    def __init__(self, settings: dict, config: dict, run_dir: str, resumed: bool):
        import wandb

        self.wandb, self.run_dir = wandb, run_dir
        run_id = _read_ids(run_dir).get("wandb", {}).get("id") if resumed else None
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=settings.get("project", "distrl"), entity=settings.get("entity"), group=settings.get("group"),
            name=settings.get("name") or _run_name(run_dir), tags=settings.get("tags"),
            mode=settings.get("mode", "offline"), dir=run_dir, config=config, id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(console="off", x_disable_stats=True, disable_code=True, disable_git=True,
                                    silent=True))
        _write_ids(run_dir, "wandb", {"id": self.run.id, "project": self.run.project})
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def row(self, row: dict, learner: dict) -> None:
        self.run.log({**_numbers(row), **_numbers(learner, "learner/")})

    def video(self, path: str, step: int) -> None:
        # Not a history row of its own: it joins the next metrics row (history rows = metrics.csv rows).
        self.run.log({"eval/video": self.wandb.Video(path, format="mp4")}, commit=False)

    def finish(self, summary: dict) -> None:
        self.run.summary.update(json.loads(json.dumps(summary)))
        best = _best_files(self.run_dir)
        if best:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", _run_name(self.run_dir))[:100]
            artifact = self.wandb.Artifact(f"{safe}-best", type="model",
                                           metadata={"best_eval_return": summary.get("best_eval_return")})
            for path in best:
                artifact.add_file(path)
            self.run.log_artifact(artifact)
        self.run.finish(exit_code=1 if summary.get("failure") else 0)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run: the config as params (`section.key`) and as config.json, one metric step per metrics
    row (step = env_steps), the summary as summary.json, `summary/<key>` metrics and tags, and the best
    checkpoint under checkpoints/."""

    name = "mlflow"

    def __init__(self, settings: dict, config: dict, run_dir: str, resumed: bool):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = settings.get("tracking_uri")
        if uri is None or uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store, kept for offline use
        self.client, self.run_dir = MlflowClient(tracking_uri=uri), run_dir
        previous = _read_ids(run_dir).get("mlflow", {}).get("run_id") if resumed else None
        if previous:
            self.run_id = previous
            self.client.update_run(previous, status="RUNNING")
            logged = self.client.get_run(previous).data.params
        else:
            experiment = self._experiment(settings.get("experiment", "distrl"))
            run = self.client.create_run(experiment, run_name=settings.get("run_name") or _run_name(run_dir),
                                         tags={"distrl.run_dir": os.path.abspath(run_dir)})
            self.run_id, logged = run.info.run_id, {}
            self.client.log_dict(self.run_id, config, "config.json")
        _write_ids(run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": uri})
        params = {k: str(v)[:MLFLOW_PARAM_MAX] for k, v in flatten(config).items()}
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), 100):  # MLflow takes at most 100 params per call
            self.client.log_batch(self.run_id, params=new[i:i + 100])
        changed = {f"resumed.{k}": v for k, v in params.items() if k in logged and logged[k] != v}
        for k, v in changed.items():  # a param cannot change: a resume's overrides become tags
            self.client.set_tag(self.run_id, k, v)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # noqa: BLE001 - another run (a sweep's trial) created it just now
            return self.client.get_experiment_by_name(name).experiment_id

    @staticmethod
    def _key(name: str) -> str:
        return re.sub(r"[^\w\-. /]", "_", name)

    def _log(self, values: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(self._key(k), float(v), now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def row(self, row: dict, learner: dict) -> None:
        self._log({**_numbers(row), **_numbers(learner, "learner/")}, int(row["env_steps"]))

    def video(self, path: str, step: int) -> None:
        self.client.log_artifact(self.run_id, path, "videos")

    def finish(self, summary: dict) -> None:
        self.client.log_dict(self.run_id, json.loads(json.dumps(summary)), "summary.json")
        self._log(_numbers(summary, "summary/"), int(summary.get("env_steps") or 0))
        for k in ("stop_reason", "failure", "solved"):
            if summary.get(k) is not None:
                self.client.set_tag(self.run_id, f"summary.{k}", str(summary[k])[:5000])
        for path in _best_files(self.run_dir):
            self.client.log_artifact(self.run_id, path, "checkpoints")
        status = "KILLED" if summary.get("stop_reason") == "interrupted" else "FAILED" if summary.get("failure") else "FINISHED"
        self.client.set_terminated(self.run_id, status)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


class Trackers:
    """The run's trackers, each dropped (with one warning) at its first failure."""

    def __init__(self, log_cfg, config: dict, run_dir: str, resumed: bool):
        self.active = []
        for name, cls in TRACKERS.items():
            settings = getattr(log_cfg, name, None)
            if settings is not None:
                self._call(name, lambda: self.active.append(cls(settings, config, run_dir, resumed)))

    def _call(self, name: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a tracker never ends a run
            print(f"distrl: warning: {name}: {' '.join(str(e).split())[:300] or type(e).__name__} "
                  f"(nothing more is logged to {name} in this run)", file=sys.stderr, flush=True)
            self.active = [t for t in self.active if t.name != name]

    def _each(self, method: str, *args) -> None:
        for tracker in list(self.active):
            self._call(tracker.name, lambda t=tracker: getattr(t, method)(*args))

    def row(self, row: dict, learner: dict | None) -> None:
        self._each("row", row, learner or {})

    def video(self, path: str, step: int) -> None:
        self._each("video", path, step)

    def finish(self, summary: dict | None) -> None:
        """End every tracker's run: with the summary and best checkpoint, or (no summary) just closed."""
        if summary is None:
            self._each("close")
        else:
            self._each("finish", summary)
        self.active = []
