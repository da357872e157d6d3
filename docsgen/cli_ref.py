"""The CLI reference, generated from the argparse parser (`distrl.cli.build_parser`): every command, its
usage line and every argument with its value, default and help. A flag added or changed in distrl/cli.py
changes this page."""
from __future__ import annotations

import argparse

import distrl.cli as cli

PAGE = "reference/cli.md"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """name -> (its parser, its one-line help), in the order they were added."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.choices:
        return ", ".join(f"`{c}`" for c in action.choices)
    what = action.metavar or (action.type.__name__ if isinstance(action.type, type) else None)
    what = what or ("path" if not action.option_strings else "text")
    many = {"+": ", one or more", "*": ", any number", "?": ", optional"}.get(action.nargs, "")
    repeat = ", repeatable" if isinstance(action, argparse._AppendAction) else ""
    return f"{what}{many}{repeat}"


def _default(action: argparse.Action) -> str:
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        return "required"
    if action.default is None or action.default is False or action.default == [] or \
            action.default is argparse.SUPPRESS:
        return ""
    return f"`{action.default}`"


def command_section(name: str, sub: argparse.ArgumentParser, help_: str) -> str:
    usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
    lines = [f"## `distrl {name}`\n", f"{help_[:1].upper()}{help_[1:]}.\n", f"```text\n{usage}\n```\n",
             "| argument | value | default | what |", "|---|---|---|---|"]
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
        lines.append(f"| {names} | {_cell(_value(action))} | {_default(action)} | {_cell(action.help or '')} |")
    return "\n".join(lines) + "\n"


def page(parser: argparse.ArgumentParser | None = None) -> str:
    parser = parser or cli.build_parser()
    subs = subcommands(parser)
    summary = "\n".join(f"| [`distrl {name}`](#distrl-{name}) | {_cell(h)} |" for name, (_, h) in subs.items())
    return "\n".join([
        "# Command line\n",
        "Generated from the argparse parser in `distrl/cli.py` (`docsgen/cli_ref.py`); `distrl COMMAND --help` "
        "prints the same. Every `--set KEY=VALUE` takes a key of the [config reference](config/index.md), its "
        "value parsed as YAML. Exit statuses: 0 the run ended normally (solved, or a stop condition); 1 a fault "
        "stopped it (`summary.json` has `stop_reason` and `failure`, and the newest checkpoint resumes it); "
        "2 bad input: one line on stderr naming the key, value or file, and nothing written; 130 interrupted "
        "(a checkpoint and `summary.json` are written; a second Ctrl-C ends the run at once).\n",
        "| command | what |\n|---|---|\n" + summary + "\n",
        *[command_section(name, sub, h) for name, (sub, h) in subs.items()],
    ])


def pages() -> dict[str, str]:
    return {PAGE: page()}
