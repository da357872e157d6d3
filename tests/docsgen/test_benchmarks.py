"""The benchmark pages come from bench/: the headline table from the JSON, the results page from
bench/RESULTS.md as it is; the README's headline table is the generated one."""
import json
import os
import shutil
import statistics

from docsgen import benchmarks

ROOT = benchmarks.ROOT


def test_the_readme_headlines_are_what_the_json_gives():
    """`python -m docsgen.benchmarks` rewrites them; a README edited by hand, or JSON re-measured without
    rewriting it, fails here."""
    with open(benchmarks.README, encoding="utf-8") as fh:
        readme = fh.read()
    assert benchmarks.readme_block() in readme
    assert benchmarks.readme_with_headlines(readme) == readme


def test_a_headline_is_the_median_of_this_codes_runs():
    with open(os.path.join(benchmarks.RESULTS_DIR, "solve_ppo_cartpole_vs_53bd0a7.json"), encoding="utf-8") as fh:
        runs = [r for r in json.load(fh)["runs"] if r["commit"] != "53bd0a7"]
    median = statistics.median(r["time_to_solve_s"] if r["solved"] else r["budget_s"] for r in runs)
    row = benchmarks.headline_rows()[0]
    assert row[1] == f"{sum(r['solved'] for r in runs)}/{len(runs)} seeds, median {median:.1f} s"


def test_the_table_follows_the_json(monkeypatch, tmp_path):
    for name in os.listdir(benchmarks.RESULTS_DIR):
        if name.endswith(".json"):
            shutil.copy(os.path.join(benchmarks.RESULTS_DIR, name), tmp_path / name)
    data = json.loads((tmp_path / "atari_peer.json").read_text())
    data["best_agent_steps_per_s"]["distrl"] = 321.0
    (tmp_path / "atari_peer.json").write_text(json.dumps(data))
    before = benchmarks.index_page()
    monkeypatch.setattr(benchmarks, "RESULTS_DIR", str(tmp_path))
    after = benchmarks.index_page()
    assert "| Atari Breakout PPO training, agent steps/s | 321 |" in after
    assert "| Atari Breakout PPO training, agent steps/s | 321 |" not in before


def test_the_results_page_is_results_md_and_its_files_exist():
    text, linked = benchmarks.results_page()
    with open(benchmarks.RESULTS_MD, encoding="utf-8") as fh:
        assert text == fh.read()
    assert linked and all(os.path.isfile(os.path.join(benchmarks.RESULTS_DIR, name)) for name in linked)
