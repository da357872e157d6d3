"""The chaos benchmark (`python -m bench.chaos`), two minutes of it in async mode (the mode with the most
roles): seeded SIGKILLs and SIGSTOPs of its roles and one SIGKILL of the driver with a resume, after which
nothing is lost and every restart is counted (see bench/chaos.py for the checks)."""
from bench.chaos import run_chaos


def test_two_minutes_of_chaos_in_async_mode_lose_nothing_and_count_every_restart(tmp_path):
    result = run_chaos("async", minutes=2, seed=0, run_dir=str(tmp_path / "run"))
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert result["ok"], (failed, result["problems"], result["faults_injected"], result["restarts_counted"],
                          result["summary"])
    assert result["faults"], result  # at least one fault besides the driver's kill
