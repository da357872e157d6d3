"""The chaos benchmark (`python -m bench.chaos`), two minutes of it in async mode (the mode with the most
roles): seeded SIGKILLs and SIGSTOPs of its roles and one SIGKILL of the driver with a resume, after which
nothing is lost and every restart is counted (see bench/chaos.py for the checks). Its env waits on the
clock (3 ms a step) rather than the CPU: the run is paced, and leaves the cores to the suite's other
pytest process; the ten-minute runs in bench/RESULTS.md run CartPole flat out."""
from bench.chaos import run_chaos

PACED = ("env.id=distrl.envs.testing:WaitingCartPole-v1", "env.kwargs={step_s: 0.003}", "eval.episodes=4")


def test_chaos_in_async_mode_loses_nothing_and_counts_every_restart(tmp_path):
    # A checkpoint every 5 s: the driver's kill waits for two after the last restart, and the resume's
    # start-up (up to ~30 s beside the suite's other process) must fit in what is left of the budget.
    result = run_chaos("async", minutes=2, seed=0, run_dir=str(tmp_path / "run"),
                       extra=(*PACED, "checkpoint.interval_s=5"))
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert result["ok"], (failed, result["problems"], result["faults_injected"], result["restarts_counted"],
                          result["ended_after_budget_s"], result["summary"])
    assert result["faults"], result  # at least one fault besides the driver's kill
