"""What a finished run wrote, read the way the tests check it."""
import csv
import os


def episode_returns(run_dir: str) -> tuple[list[float], list[float]]:
    """The training and the evaluation return means that metrics.csv logged (rows that logged one)."""
    with open(os.path.join(run_dir, "metrics.csv")) as fh:
        rows = list(csv.DictReader(fh))
    return ([float(r["train_return_mean"]) for r in rows if r["train_return_mean"]],
            [float(r["eval_return_mean"]) for r in rows if r["eval_return_mean"]])
