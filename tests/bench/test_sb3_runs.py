from bench.peers.sb3_runs import summarise


def run(side: str, seed: int, t: float | None) -> dict:
    return {"side": side, "seed": seed, "solved": t is not None, "time_to_solve_s": t, "best_eval_return": 10.0,
            "env_steps": 1000}


def test_the_ratio_is_exact_when_both_sides_solve_every_seed():
    s = summarise([run("distrl", 0, 100.0), run("sb3", 0, 300.0), run("distrl", 1, 200.0), run("sb3", 1, 500.0),
                   run("distrl", 2, 150.0), run("sb3", 2, 400.0)], budget=1200.0)
    assert s["distrl"]["median_time_to_solve_s"] == 150.0 and s["sb3"]["median_time_to_solve_s"] == 400.0
    assert s["ratio_sb3_over_distrl"] == 400.0 / 150.0 and "ratio_unsolved_as_budget" not in s


def test_an_unsolved_peer_seed_counts_as_the_budget_and_the_ratio_is_a_lower_bound():
    s = summarise([run("distrl", 0, 100.0), run("sb3", 0, None), run("distrl", 1, 200.0), run("sb3", 1, None),
                   run("distrl", 2, 150.0), run("sb3", 2, 900.0)], budget=1200.0)
    assert s["sb3"]["solved"] == 1 and s["sb3"]["median_time_to_solve_s"] is None
    assert s["ratio_sb3_over_distrl"] is None
    assert s["ratio_unsolved_as_budget"] == 1200.0 / 150.0 and s["ratio_unsolved_as_budget_is"] == "lower bound"
