"""The config reference is generated from the dataclasses: every key of every algorithm is on it with its
type, default, range and doc, and a field added or changed in the code changes the pages."""
import dataclasses
import re

import distrl.config
from distrl.algos.ppo import PPOConfig
from distrl.config import Config, config_class, describe, section
from distrl.config.fields import f
from distrl.config.sections import StopConfig
from distrl.registry import ALGORITHMS
from docsgen import config_ref


def keys_on(text: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))


def test_every_key_of_every_algorithm_is_on_its_pages():
    pages = config_ref.pages()
    for name in ALGORITHMS:
        # `distrl config`'s own listing of the defaults: another walk of the same dataclasses.
        expected = {line.split(" = ")[0] for line in describe(config_class(name)) if " = " in line}
        shown = keys_on(pages[config_ref.INDEX]) | keys_on(pages[config_ref.page_of(name)])
        assert expected <= shown, sorted(expected - shown)


def test_a_row_says_type_default_range_and_doc():
    index = config_ref.pages()[config_ref.INDEX]
    assert "| `replay.alpha` | float | `0.6` | ≥ 0, ≤ 1 | priority exponent (0 = uniform) |" in index
    assert "| `mode` | str | `async` | one of single, sync, async |" in index
    assert "| `stop.max_env_steps` | int or null | `null` | ≥ 1 |" in index
    ppo = config_ref.pages()[config_ref.page_of("ppo")]
    assert "| `model.activation` | str | `tanh` |" in ppo  # the algorithm's own model defaults, not the class's


def test_a_new_run_field_appears_on_the_index(monkeypatch):
    before = config_ref.pages()[config_ref.INDEX]
    stop = dataclasses.make_dataclass("StopConfig", [
        ("max_episodes", int | None, f(None, "episodes before the run stops (null = no limit)", lo=1))],
        bases=(StopConfig,))
    run = dataclasses.make_dataclass("Config", [("stop", stop, section(stop, "stop conditions"))], bases=(Config,))
    monkeypatch.setattr(distrl.config, "Config", run)
    after = config_ref.pages()[config_ref.INDEX]
    row = "| `stop.max_episodes` | int or null | `null` | ≥ 1 | episodes before the run stops (null = no limit) |"
    assert row in after and row not in before


def test_a_changed_algorithm_field_changes_its_page(monkeypatch):
    before = config_ref.pages()[config_ref.page_of("ppo")]
    ppo = dataclasses.make_dataclass("PPOConfig", [
        ("lr", float, f(1e-3, "Adam's learning rate, changed", lo=0.0, hi=1.0)),
        ("kl_target", float, f(0.01, "a field the code gained", lo=0.0, lo_open=True))], bases=(PPOConfig,))
    real = config_class("ppo")
    run = dataclasses.make_dataclass("PPORunConfig", [("ppo", ppo, section(ppo, "ppo hyper-parameters"))],
                                     bases=(real,))
    monkeypatch.setattr(distrl.config, "config_class", lambda name: run if name == "ppo" else config_class(name))
    after = config_ref.pages()[config_ref.page_of("ppo")]
    assert after != before
    assert "| `ppo.kl_target` | float | `0.01` | > 0 | a field the code gained |" in after
    assert "| `ppo.lr` | float | `0.001` | ≥ 0, ≤ 1 | Adam's learning rate, changed |" in after
    assert "| `ppo.lr` | float | `0.0003` |" in before


def test_range_text():
    assert config_ref.range_text({"lo": 0.0, "lo_open": True, "hi": 10_000.0}) == "> 0, ≤ 10,000"
    assert config_ref.range_text({"choices": ("local", "central")}) == "one of local, central"
    assert config_ref.range_text({"item_lo": 1, "min_items": 0}) == "a list of ints ≥ 1"
    assert config_ref.range_text({"item_lo": 1, "min_items": 1}) == "a non-empty list of ints ≥ 1"
    assert config_ref.range_text({"item_lo": 1, "hi": 8192, "min_items": 0}) == "a list of ints ≥ 1 and ≤ 8,192"
    assert config_ref.range_text({}) == ""


def test_the_algorithms_table_says_what_each_algorithm_declares():
    """docs/concepts/algorithms.md's table is written by hand: its modes, action spaces and data paths are the
    ones the algorithms declare (the checks refuse a mode that is not on an algorithm's class)."""
    from pathlib import Path

    from distrl.registry import algorithm

    table = Path(__file__).parents[2] / "docs" / "concepts" / "algorithms.md"
    rows = {m[0]: m[1:] for m in re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", table.read_text(),
                                          flags=re.M)}
    rows.pop("algo")  # the header
    assert set(rows) == set(ALGORITHMS)
    for name, (actions, data_path, modes) in rows.items():
        a = algorithm(name)
        assert [m.strip() for m in modes.split(",")] == list(a.modes), name
        kinds = {"Discrete": "discrete", "Box": "box", "MultiDiscrete": "multi_discrete", "MultiBinary": "multi_binary"}
        assert {kinds[w] for w in re.findall(r"\b(MultiDiscrete|MultiBinary|Discrete|Box)\b", actions)} == set(a.actions), name
        assert a.data_path in data_path or (a.offline and "data.dataset" in data_path), name
