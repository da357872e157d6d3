from bench.solve import summarise, table


def run(solved: bool, time_s: float, lag: dict | None) -> dict:
    return {"solved": solved, "time_to_solve_s": time_s if solved else None, "env_steps": 0, "updates": 100,
            "updates_per_s": 50.0, "policy_lag": lag}


def test_an_unsolved_run_counts_as_its_budget_and_offline_runs_have_no_lag():
    s = summarise([run(True, 4.0, None), run(False, 0.0, None), run(True, 6.0, None)], budget=300.0)
    assert (s["time_to_solve_s"], s["solved"], s["runs"]) == (6.0, 2, 3)
    assert s["policy_lag_p50"] is None and s["policy_lag_p90"] is None


def test_the_lag_is_the_median_over_the_runs_that_have_one():
    s = summarise([run(True, 1.0, {"p50": 1.0, "p90": 3.0}), run(True, 2.0, {"p50": 2.0, "p90": 5.0}),
                   run(True, 3.0, None)], budget=10.0)
    assert (s["policy_lag_p50"], s["policy_lag_p90"]) == (1.5, 4.0)


def test_the_table_has_a_row_per_side_and_a_dash_for_no_lag():
    runs = [run(True, 4.0, None), run(True, 6.0, None)]
    text = table({"median": {"abc1234 single": summarise(runs, 300.0),
                             "def5678 single": summarise([run(True, 2.0, {"p50": 1.0, "p90": 2.0})], 300.0)}})
    rows = text.splitlines()[2:]
    assert rows[0].startswith("| abc1234 single | 2/2 | 300 | 5.0 |") and rows[0].endswith("| - |")
    assert rows[1].endswith("| 1 / 2 |")
