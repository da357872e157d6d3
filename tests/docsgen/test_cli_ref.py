"""The CLI reference is generated from the argparse parser: every command and flag is on it, and a flag
added to the code appears there."""
import argparse

import distrl.cli
from docsgen import cli_ref


def test_every_command_and_flag_is_on_the_page():
    page = cli_ref.page()
    parser = distrl.cli.build_parser()
    for name, (sub, _) in cli_ref.subcommands(parser).items():
        assert f"## `distrl {name}`" in page
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):  # -h: every command has it
                continue
            for option in action.option_strings:
                assert f"`{option}`" in page, (name, option)
            assert action.help and action.help in page, (name, action.dest)  # every argument has a help line


def test_a_row_says_value_default_and_help():
    page = cli_ref.page()
    assert "| `--mode` | `single`, `sync`, `async` |  | run mode (sets mode) |" in page
    assert "| `--seed` | int | `12345` | seed of the evaluation envs |" in page
    assert "| `--episodes` | int | required | whole episodes to record |" in page
    assert "| `--epsilon` | float | `0.0` |" in page


def test_a_new_flag_appears_on_the_page(monkeypatch):
    before = cli_ref.page()
    real = distrl.cli.build_parser

    def with_a_new_flag():
        parser = real()
        train = cli_ref.subcommands(parser)["train"][0]
        train.add_argument("--max-episodes", type=int, default=100, help="episodes before the run stops")
        return parser

    monkeypatch.setattr(distrl.cli, "build_parser", with_a_new_flag)
    after = cli_ref.page()
    row = "| `--max-episodes` | int | `100` | episodes before the run stops |"
    assert row in after and row not in before
    assert "[--max-episodes MAX_EPISODES]" in after
