"""The examples in the docs: fenced blocks a user would copy, and what each one is.

A `bash`, `python` or `yaml` fence is an example, and a test runs it (tests/docsgen/test_examples.py):

    ```bash                                     run, in the page's order, in a scratch directory
    ```python title="my_nets.py"                a file: written there, for the commands after it
    ```bash title="not run: needs a GPU"        shown, not run; the reason is required

Material shows the title above the block, so the reader sees what is not run, and why. Other fences
(`text` for output, `mermaid`) are not examples. `problems` lists what the build refuses: an example
without a valid annotation, a `distrl` command the CLI would not parse, a YAML config fragment the config
would not take, an inline `section.key` that is no config key, an inline repository path that does not
exist. The mkdocs hook logs each as a warning, which `mkdocs build --strict` turns into a failure.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import typing

import yaml

EXAMPLE_LANGS = ("bash", "python", "yaml")
NOT_EXAMPLES = ("text", "mermaid", "json", "csv", "markdown")
NOT_RUN = "not run:"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,})(?P<info>[^`\n]*)$")


@dataclasses.dataclass
class Block:
    lang: str
    title: str
    text: str
    line: int  # 1-based line of the opening fence

    @property
    def kind(self) -> str:
        """run | file | skip (not run, with a reason) | other (not an example)."""
        if self.lang not in EXAMPLE_LANGS:
            return "other"
        if self.title.startswith(NOT_RUN):
            return "skip"
        return "file" if self.title else "run"

    @property
    def reason(self) -> str:
        return self.title[len(NOT_RUN):].strip() if self.kind == "skip" else ""


def blocks(markdown: str) -> list[Block]:
    """Every fenced block of a page, indented ones (in lists, admonitions) included."""
    out, lines, i = [], markdown.split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info, indent, fence = m.group("info").strip(), m.group("indent"), m.group("fence")
        lang = info.split()[0] if info else ""
        title = re.search(r'title="([^"]*)"', info)
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        out.append(Block(lang, title.group(1).strip() if title else "", "\n".join(body), i + 1))
        i = j + 1
    return out


def commands(script: str) -> list[list[str]]:
    """The commands of a bash block as argv lists: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [argv for line in joined.split("\n") if (argv := shlex.split(line, comments=True))]


def env_and_argv(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """`VAR=value ... cmd args` -> ({VAR: value}, [cmd, args])."""
    env = {}
    while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
        key, _, value = argv[0].partition("=")
        env[key], argv = value, argv[1:]
    return env, argv


def _config_keys() -> tuple[set[str], set[str], set[str]]:
    """Every dotted config key of every algorithm, the keys whose value is a mapping (free below them), and
    the top-level section names."""
    import distrl.config as config
    from distrl.registry import ALGORITHMS

    keys, mappings, sections = set(), set(), set()

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for fld in dataclasses.fields(cls):
            key = prefix + fld.metadata.get("key", fld.name)
            keys.add(key)
            if dataclasses.is_dataclass(hints[fld.name]):
                if not prefix:
                    sections.add(key)
                walk(hints[fld.name], key + ".")
            elif dict in (hints[fld.name], *typing.get_args(hints[fld.name])):
                mappings.add(key)

    for name in ALGORITHMS:
        walk(config.config_class(name), "")
    return keys, mappings, sections


FILE_SUFFIX = re.compile(r"\.(py|json|jsonl|yaml|yml|csv|png|mp4|gif|md|npz|log|safetensors|hdf5|txt|toml)$")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
REPO_PATH = re.compile(r"^(distrl|tests|configs|bench|docs|docsgen)/[\w./-]*$")


def _prose(markdown: str) -> str:
    """The page without its fenced blocks (inline code in prose only)."""
    keep, fence = [], None
    for line in markdown.split("\n"):
        m = FENCE.match(line)
        if m and fence is None:
            fence = m.group("fence")
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            keep.append(line)
    return "\n".join(keep)


def inline_problems(markdown: str, known=None) -> list[str]:
    """Inline `section.key` that is no config key, inline repository paths that do not exist."""
    keys, mappings, sections = known or _config_keys()
    out = []
    for code in INLINE.findall(_prose(markdown)):
        token = re.sub(r"\[[^\]]*\]$", "", re.split(r"[=:\s]", code.strip(), maxsplit=1)[0])
        if REPO_PATH.match(token):
            if not os.path.exists(os.path.join(ROOT, token)):
                out.append(f"`{code}`: no such file or directory in the repository")
            continue
        parts = token.split(".")
        if len(parts) < 2 or parts[0] not in sections or FILE_SUFFIX.search(token):
            continue
        prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if token not in keys and not any(p in mappings for p in prefixes[:-1]):
            out.append(f"`{code}`: no config key {token} (docs/reference/config is generated from the config)")
    return out


def _yaml_problem(block: Block) -> str | None:
    from distrl.config import ConfigError, from_dict

    try:
        data = yaml.safe_load(block.text)
        from_dict(data if isinstance(data, dict) else {})
    except (yaml.YAMLError, ConfigError, TypeError) as e:
        return f"line {block.line}: this YAML is not a config distrl takes: {e}"
    return None


def _distrl_problem(argv: list[str], line: int) -> str | None:
    """Whether the CLI parses the command, and, for a config of the repository, whether its overrides are
    keys and values the config takes (the run itself may still need a cluster or a GPU)."""
    from distrl.cli import UsageError, build_parser
    from distrl.config import ConfigError, load_config

    try:
        args = build_parser().parse_args(argv[1:])
        config = getattr(args, "config", None)
        if args.command in ("train", "config", "tune") and config and os.path.isfile(os.path.join(ROOT, config)):
            load_config(os.path.join(ROOT, config), _overrides(args))
    except (UsageError, SystemExit, ConfigError) as e:
        return f"line {line}: `{shlex.join(argv)}`: the CLI does not take it: {e}"
    return None


def _overrides(args) -> list[str]:
    """The config overrides a parsed command makes: --set, train's flags, tune's first grid values."""
    out = list(args.overrides)
    for key, flag in (("mode", "mode"), ("workers", "workers"), ("device", "device"),
                      ("stop.max_seconds", "max_seconds"), ("seed", "seed")):
        if getattr(args, flag, None) is not None:
            out.append(f"{key}={getattr(args, flag)}")
    for axis in getattr(args, "grid", []):
        key, _, values = axis.partition("=")
        if "(" not in values:  # a sampled range, e.g. loguniform(1e-4,1e-2), is checked by the sweep
            out.append(f"{key}={values.split(',')[0]}")
    return out


def block_problems(block: Block) -> list[str]:
    """What is wrong with one fenced block as an example."""
    if block.lang in ("sh", "shell", "console", "py", "python3", "yml", ""):
        return [f"line {block.line}: a ```{block.lang} fence: examples are bash, python or yaml (run by the "
                f"tests), output is text"]
    if block.kind == "other":
        return [] if block.lang in NOT_EXAMPLES else [f"line {block.line}: unknown fence language {block.lang!r}"]
    if block.kind == "skip" and not block.reason:
        return [f"line {block.line}: 'not run:' needs its reason"]
    out = []
    if block.lang == "bash":
        for argv in commands(block.text):
            _, argv = env_and_argv(argv)
            if argv and argv[0] == "distrl" and (problem := _distrl_problem(argv, block.line)):
                out.append(problem)
    if block.lang == "yaml" and block.kind != "file" and (problem := _yaml_problem(block)):
        out.append(problem)
    return out


def problems(markdown: str) -> list[str]:
    """Everything `mkdocs build --strict` refuses on a page (see the module's doc)."""
    return [p for b in blocks(markdown) for p in block_problems(b)] + inline_problems(markdown)
