"""The benchmark pages: bench/RESULTS.md as a page of the site (read at build time, never copied), and the
headline table, computed from bench/results/*.json (the same table stands in the README between markers;
`python -m docsgen.benchmarks` rewrites it there, and a test checks that it is current)."""
from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "bench", "results")
RESULTS_MD = os.path.join(ROOT, "bench", "RESULTS.md")
RESULTS_PAGE = "benchmarks/results.md"
INDEX_PAGE = "benchmarks/index.md"
README = os.path.join(ROOT, "README.md")
BEGIN = "<!-- headlines: generated from bench/results/*.json by `python -m docsgen.benchmarks`; do not edit -->"
END = "<!-- end of headlines -->"


def load(name: str) -> dict:
    with open(os.path.join(RESULTS_DIR, name), encoding="utf-8") as fh:
        return json.load(fh)


def solve_median(name: str) -> dict:
    """The median block of this code's runs in a `bench.solve` JSON (in a `--against REV` file, the side
    that is not REV)."""
    data = load(name)
    against = re.search(r"_vs_([0-9a-f]+)\.json$", name)
    keys = [k for k in data["median"] if not (against and k.startswith(against.group(1)))]
    if len(keys) != 1:
        raise ValueError(f"{name}: expected one median of this code, found {keys}")
    return data["median"][keys[0]]


def _s(x: float) -> str:
    return f"{x:,.0f} s" if x >= 100 else f"{x:.1f} s"


def _solved(m: dict) -> str:
    return f"{m['solved']}/{m['runs']} seeds, median {_s(m['time_to_solve_s'])}"


def headline_rows() -> list[tuple[str, str, str, str]]:
    """(task, distrl, peer on the same machine, JSON files): every figure read from bench/results."""
    ppo = solve_median("solve_ppo_cartpole_vs_53bd0a7.json")
    sb3_ppo = load("sb3_cartpole.json")["summary"]
    apex_minatar = solve_median("solve_apex_dqn_minatar_breakout.json")
    ppo_minatar = solve_median("solve_ppo_minatar_breakout.json")
    sb3_dqn = load("sb3_minatar.json")["summary"]
    atari = load("atari_peer.json")
    offline = load("offline.json")["median"]
    hour = load("atari_breakout_60min.json")["summary"]
    soak = load("soak.json")
    growth = max(abs(v["rss"]["growth_pct"]) for v in soak["growth"].values())
    kept = "the checkpoint and resume restored every counter and the replay" if soak["nothing_lost"]["ok"] else \
        "NOT everything was kept (see the soak section)"
    cql, d3_cql = offline["CQL, mixed CartPole / distrl"], offline["CQL, mixed CartPole / d3rlpy"]
    bc, d3_bc = offline["BC, expert CartPole / distrl"], offline["BC, expert CartPole / d3rlpy"]
    r2d2 = solve_median("solve_r2d2_position_only_cartpole_vs_53bd0a7.json")
    dhc = solve_median("solve_dhc_mapf_8x8_vs_53bd0a7.json")
    sac = solve_median("solve_sac_lunarlander_continuous_vs_53bd0a7.json")
    return [
        ("PPO solves CartPole-v1 (475)", _solved(ppo),
         f"Stable-Baselines3 PPO, rl-zoo settings: {_sb3_times(sb3_ppo)}; with distrl's settings: "
         f"{_sb3_times(load('sb3_cartpole_same.json')['summary'])}",
         "solve_ppo_cartpole_vs_53bd0a7, sb3_cartpole, sb3_cartpole_same"),
        ("Ape-X DQN reaches 10 on MinAtar Breakout", _solved(apex_minatar),
         f"Stable-Baselines3 DQN, MinAtar's DQN settings: {sb3_dqn['sb3']['solved']}/{sb3_dqn['sb3']['runs']} seeds within "
         f"{_s(load('sb3_minatar.json')['budget_s'])}, ≥ {sb3_dqn['ratio_unsolved_as_budget']:.2f}× distrl's time; "
         f"distrl's settings on both sides (neither with prioritized replay, double or dueling Q): "
         f"{_sb3_against(load('sb3_minatar_same.json')['summary'], load('sb3_minatar_same.json')['budget_s'])}",
         "solve_apex_dqn_minatar_breakout, sb3_minatar, sb3_minatar_same"),
        ("PPO reaches 10 on MinAtar Breakout", _solved(ppo_minatar), "", "solve_ppo_minatar_breakout"),
        ("Atari Breakout PPO training, agent steps/s", f"{atari['best_agent_steps_per_s']['distrl']:.0f}",
         f"Sample Factory, its Atari settings on both sides: {atari['best_agent_steps_per_s']['sample-factory']:.0f} (distrl "
         f"{atari['ratio_distrl_over_sample_factory']:.2f}×)", "atari_peer"),
        ("CQL on a mixed CartPole dataset (475)", _solved(cql),
         f"d3rlpy CQL, the same networks, batches and learning rates: {_solved(d3_cql)} (unsolved counted as the "
         f"budget)", "offline"),
        ("BC on an expert CartPole dataset (475)", _solved(bc), f"d3rlpy BC, the same settings: {_solved(d3_bc)}", "offline"),
        ("R2D2 solves CartPole without velocities", _solved(r2d2), "", "solve_r2d2_position_only_cartpole_vs_53bd0a7"),
        _memory_row(),
        ("MAPPO: 3 agents on simple_spread, -14 within 600 s",
         _solved(solve_median("solve_mappo_simple_spread.json")), "", "solve_mappo_simple_spread"),
        ("IPPO with continuous actions on simple_spread, -15 within 900 s",
         _solved(solve_median("solve_ippo_simple_spread_continuous.json")), "", "solve_ippo_simple_spread_continuous"),
        ("MAPPO: 4 agents on an 8×8 map, ≥ 90% success",
         _solved(solve_median("solve_mappo_mapf_8x8.json")), "", "solve_mappo_mapf_8x8"),
        ("DHC: 4 agents on an 8×8 map, ≥ 90% success", _solved(dhc), "", "solve_dhc_mapf_8x8_vs_53bd0a7"),
        ("SAC reaches 200 on LunarLanderContinuous", _solved(sac) + f" of a {_s(sac['budget_s'])} budget", "",
         "solve_sac_lunarlander_continuous_vs_53bd0a7"),
        ("Ape-X DQN on Atari Breakout, one hour", f"best eval {hour['best_eval_return']} after "
         f"{hour['env_steps'] / 1e3:,.0f}k agent steps (4 frames each: {hour['env_steps'] * 4 / 1e6:.2f}M frames)", "",
         "atari_breakout_60min"),
        _minigrid_row(),
        ("PPO on VizDoom Basic (Dict: screen + ammo, 75)",
         _solved(solve_median("solve_ppo_vizdoom_basic.json")), "", "solve_ppo_vizdoom_basic"),
        _taxi_ppo_row(),
        ("Ape-X DQN on Taxi-v4 with its action mask (7.0)",
         f"{_solved(solve_median('solve_apex_dqn_taxi_masked.json'))}; "
         f"{_unmasked(solve_median('solve_apex_dqn_taxi_unmasked.json'))}", "",
         "solve_apex_dqn_taxi_masked, solve_apex_dqn_taxi_unmasked"),
        _sb3_mujoco_row("sac_halfcheetah", "SAC reaches 5,000 on HalfCheetah-v5", same="sac_halfcheetah_same"),
        _sb3_mujoco_row("ppo_hopper", "PPO reaches 2,000 on Hopper-v5 (normalized)", same="ppo_hopper_same"),
        (f"{soak['minutes']:.0f} minutes of an async run, its learner and parameter server killed",
         f"every role's memory within {growth:.1f}% of its size after warm-up; {kept}", "", "soak"),
    ]


def _memory_row() -> tuple[str, str, str, str]:
    """PPO with an LSTM on the POMDP R2D2's headline row solves, and the same config with no core."""
    lstm = solve_median("solve_ppo_lstm_position_only_cartpole.json")
    flat = solve_median("solve_ppo_feedforward_position_only_cartpole.json")
    return ("PPO with an LSTM solves CartPole without velocities", f"{_solved(lstm)}; with no core: "
            f"{flat['solved']}/{flat['runs']} within {_s(flat['budget_s'])}", "",
            "solve_ppo_lstm_position_only_cartpole, solve_ppo_feedforward_position_only_cartpole")


def _unmasked(m: dict) -> str:
    return f"with env.action_mask=none: {m['solved']}/{m['runs']} seeds within {_s(m['budget_s'])}"


def _minigrid_row() -> tuple[str, str, str, str]:
    """PPO on MiniGrid's Dict observation against SB3 PPO with rl-zoo's settings for the env."""
    data = load("sb3_minigrid.json")
    summary, budget = data["summary"], data["budget_s"]
    ours = summary["distrl"]
    return ("PPO on MiniGrid-DoorKey-5x5 (Dict observation, 0.9)",
            f"{ours['solved']}/{ours['runs']} seeds, median {_s(ours['median_unsolved_as_budget_s'])} of {_s(budget)}",
            f"Stable-Baselines3 PPO, rl-zoo settings: {_sb3_against(summary, budget)}; MultiInputPolicy on the "
            f"same Dict (rl-zoo's numbers otherwise): {_sb3_against(load('sb3_minigrid_multi_input.json')['summary'], budget)}; "
            f"with distrl's settings: {_sb3_against(load('sb3_minigrid_same.json')['summary'], budget)}",
            "sb3_minigrid, sb3_minigrid_multi_input, sb3_minigrid_same")


def _taxi_ppo_row() -> tuple[str, str, str, str]:
    """PPO with Taxi's action mask against sb3-contrib's MaskablePPO, and without the mask."""
    summary = load("sb3_taxi_masked.json")["summary"]
    ours = summary["distrl"]
    distrl = (f"{ours['solved']}/{ours['runs']} seeds, median {_s(ours['median_time_to_solve_s'])}; "
              f"{_unmasked(solve_median('solve_ppo_taxi_unmasked.json'))}")
    return ("PPO on Taxi-v4 with its action mask (7.0)", distrl,
            f"sb3-contrib MaskablePPO, distrl's settings and the same mask: {_sb3_times(summary)}",
            "sb3_taxi_masked, solve_ppo_taxi_unmasked")


def _sb3_times(summary: dict) -> str:
    """SB3's median time to solve against distrl's, both sides solving every seed."""
    return (f"{summary['ratio_sb3_over_distrl']:.2f}× distrl's time ({_s(summary['sb3']['median_time_to_solve_s'])} "
            f"against {_s(summary['distrl']['median_time_to_solve_s'])}, {summary['distrl']['runs']} seeds)")


def _sb3_mujoco_row(peer: str, task: str, same: str | None = None) -> tuple[str, str, str, str]:
    """A MuJoCo config against Stable-Baselines3 (`bench.peers.sb3_mujoco`): distrl's seeds, and SB3's with
    rl-zoo's settings; `same`: the peer run with distrl's own settings on SB3's side too."""
    data = load(f"sb3_{peer}.json")
    summary, budget = data["summary"], data["budget_s"]
    ours = summary["distrl"]
    distrl = f"{ours['solved']}/{ours['runs']} seeds, median {_s(ours['median_unsolved_as_budget_s'])} of {_s(budget)}"
    if not summary.get("sb3"):
        return task, distrl, "Stable-Baselines3: not run", f"sb3_{peer}"
    peers = f"Stable-Baselines3, rl-zoo settings: {_sb3_against(summary, budget)}"
    if same is not None:
        other = load(f"sb3_{same}.json")
        peers += f"; with distrl's settings: {_sb3_against(other['summary'], other['budget_s'])}"
    return task, distrl, peers, ", ".join(f"sb3_{p}" for p in (peer, same) if p)


def _sb3_against(summary: dict, budget: float) -> str:
    sb3 = summary["sb3"]
    if summary.get("ratio_sb3_over_distrl") is not None:
        ratio = f"{summary['ratio_sb3_over_distrl']:.2f}× distrl's time"
    else:
        ratio = f"≥ {summary['ratio_unsolved_as_budget']:.2f}× distrl's time (unsolved counted as the budget)"
    return f"{sb3['solved']}/{sb3['runs']} seeds within {_s(budget)}, {ratio}"


def headline_table(link_prefix: str) -> str:
    """The headline table in markdown; `link_prefix`: where bench/results/ is from the page."""
    lines = ["| on 2 vCPUs, no GPU | distrl | peer, same machine and criterion | JSON |", "|---|---|---|---|"]
    for task, ours, peer, files in headline_rows():
        links = ", ".join(f"[{f}]({link_prefix}{f}.json)" for f in files.split(", "))
        lines.append(f"| {task} | {ours} | {peer or '—'} | {links} |")
    return "\n".join(lines)


def readme_block() -> str:
    return f"{BEGIN}\n{headline_table('bench/results/')}\n{END}"


def readme_with_headlines(text: str) -> str:
    """`text` (the README) with its headline block replaced by the one computed now."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + readme_block() + text[end:]


def index_page() -> str:
    return "\n".join([
        "# Benchmarks\n",
        "Headline figures, computed from the JSON each benchmark wrote to `bench/results/` when the site was "
        "built (`docsgen/benchmarks.py`): medians over seeds, each run timed from its command's start (Python, "
        "torch and Ray start-up included), on 2-vCPU VMs with no GPU. Every table, with what was measured, the "
        "command, the commit and the machine, is in [Results](results.md); how to run the benchmarks is in "
        "[Running the benchmarks](running.md).\n",
        headline_table("results/"),
    ])


def results_page() -> tuple[str, list[str]]:
    """bench/RESULTS.md as a page under benchmarks/, and the files under bench/results/ it links to."""
    with open(RESULTS_MD, encoding="utf-8") as fh:
        text = fh.read()
    linked = sorted(set(re.findall(r"\]\(results/([^)\s]+)\)", text)))
    return text, linked


def results_files() -> list[str]:
    """Every JSON under bench/results/ (the headline table links to them)."""
    return sorted(n for n in os.listdir(RESULTS_DIR) if n.endswith(".json"))


def pages() -> dict[str, str]:
    return {INDEX_PAGE: index_page(), RESULTS_PAGE: results_page()[0]}


if __name__ == "__main__":
    with open(README, encoding="utf-8") as fh:
        current = fh.read()
    with open(README, "w", encoding="utf-8") as fh:
        fh.write(readme_with_headlines(current))
    print(f"{README}: headlines rewritten", file=sys.stderr)
