"""The config reference, generated from the dataclasses: every key of every section, per algorithm, with
its type, default, range and doc (the `f(...)` metadata of `distrl/config`). Nothing here is written by hand:
a field added, removed or changed in distrl/config or in an algorithm's section changes these pages."""
from __future__ import annotations

import dataclasses
import sys
import types
import typing

import yaml

import distrl.config as config
from distrl.registry import ALGORITHMS, algorithm

INDEX = "reference/config/index.md"
RUN_KEYS_TITLE = "Run settings"


def page_of(algo: str) -> str:
    return f"reference/config/{algo}.md"


def _key(fld: dataclasses.Field) -> str:
    return fld.metadata.get("key", fld.name)


def type_text(tp: typing.Any) -> str:
    """`int | None` -> `int or null`, `list` -> `list`."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def default_text(fld: dataclasses.Field) -> str:
    value = fld.default_factory() if fld.default_factory is not dataclasses.MISSING else fld.default
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def range_text(meta: typing.Mapping) -> str:
    """What `distrl.config.parse._check_range` accepts, in words."""
    if meta.get("choices"):
        return "one of " + ", ".join(str(c) for c in meta["choices"])
    if meta.get("item_lo") is not None:
        n = meta.get("min_items", 1)
        what = {0: "a list", 1: "a non-empty list"}.get(n, f"a list of at least {n}")
        most = f" and ≤ {number(meta['hi'])}" if meta.get("hi") is not None else ""
        return f"{what} of ints ≥ {meta['item_lo']}{most}"
    lo, hi = meta.get("lo"), meta.get("hi")
    parts = []
    if lo is not None:
        parts.append(f"> {number(lo)}" if meta.get("lo_open") else f"≥ {number(lo)}")
    if hi is not None:
        parts.append(f"≤ {number(hi)}")
    return ", ".join(parts)


def number(x: float) -> str:
    """1e12 -> 1,000,000,000,000; 0.5 -> 0.5."""
    return f"{int(x):,}" if float(x).is_integer() else repr(x)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(cls: type, prefix: str = "", defaults: typing.Any = None) -> list[tuple[str, str, str, str, str]]:
    """(key, type, default, range, doc) for every leaf field of dataclass `cls`, nested sections flattened
    to dotted keys; `defaults` (an instance) overrides the class defaults (an algorithm's `model` defaults)."""
    out = []
    hints = typing.get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        key = prefix + _key(fld)
        if dataclasses.is_dataclass(hints[fld.name]):
            out.extend(rows(hints[fld.name], key + ".", getattr(defaults, fld.name, None)))
            continue
        default = default_text(fld)
        if defaults is not None:
            default = yaml.safe_dump(getattr(defaults, fld.name), default_flow_style=True, width=10_000).strip()
            default = default.removesuffix("...").strip()
        out.append((key, type_text(hints[fld.name]), default, range_text(fld.metadata), fld.metadata.get("doc", "")))
    return out


def table(cls: type, prefix: str = "", defaults: typing.Any = None) -> str:
    lines = ["| key | type | default | range | doc |", "|---|---|---|---|---|"]
    for key, tp, default, rng, doc in rows(cls, prefix, defaults):
        lines.append(f"| `{key}` | {tp} | `{_cell(default)}` | {_cell(rng)} | {_cell(doc)} |")
    return "\n".join(lines)


def _doc(cls: type) -> str:
    """A section class's own docstring (not dataclass's generated signature)."""
    doc = cls.__dict__.get("__doc__") or ""
    return "" if doc.startswith(cls.__name__ + "(") else " ".join(doc.split())


def _section_block(key: str, cls: type, doc: str, defaults: typing.Any = None) -> str:
    first, _, rest = doc.partition(" ")
    doc = f"`{first}` {rest}" if first == key else doc[:1].upper() + doc[1:]
    text = f"### `{key}`\n\n{doc}."
    if _doc(cls):
        text += f" {_doc(cls)}"
    return text + "\n\n" + table(cls, key + ".", defaults) + "\n"


def _run_sections() -> list[tuple[str, type, str]]:
    hints = typing.get_type_hints(config.Config)
    return [(_key(fl), hints[fl.name], fl.metadata.get("doc", "")) for fl in dataclasses.fields(config.Config)
            if dataclasses.is_dataclass(hints[fl.name])]


def _top_level_table() -> str:
    lines = ["| key | type | default | range | doc |", "|---|---|---|---|---|"]
    hints = typing.get_type_hints(config.Config)
    for fl in dataclasses.fields(config.Config):
        if not dataclasses.is_dataclass(hints[fl.name]):
            lines.append(f"| `{_key(fl)}` | {type_text(hints[fl.name])} | `{_cell(default_text(fl))}` | "
                         f"{_cell(range_text(fl.metadata))} | {_cell(fl.metadata.get('doc', ''))} |")
    return "\n".join(lines)


def index_page() -> str:
    algos = "\n".join(f"| [`{name}`]({name}.md) | {algorithm(name).data_path} | "
                      f"{', '.join(s[0] for s in config.DATA_SECTIONS[algorithm(name).data_path])} |"
                      for name in ALGORITHMS)
    data = {}
    for path, sections in config.DATA_SECTIONS.items():
        for key, cls, doc in sections:
            data.setdefault(key, (cls, doc, []))[2].append(path)
    parts = [
        "# Config reference\n",
        "Generated from the dataclasses in `distrl/config/` and each algorithm's section (`docsgen/config_ref.py`): "
        "every key, its type, default, valid range and doc. A run's config holds the run settings below, the "
        "sections of its algorithm's data path, a `model` section with its algorithm's defaults, and the "
        "algorithm's own section; `distrl config CONFIG` prints the keys of one config as a run reads them.\n",
        "| algorithm | data path | data-path sections |\n|---|---|---|\n" + algos + "\n",
        f"## {RUN_KEYS_TITLE}\n\nEvery algorithm reads these.\n\n" + _top_level_table() + "\n",
        *[_section_block(key, cls, doc) for key, cls, doc in _run_sections()],
        "## Data-path sections\n",
        *[_section_block(key, cls, f"{doc} (read by {' and '.join(paths)} algorithms)")
          for key, (cls, doc, paths) in data.items()],
    ]
    return "\n".join(parts)


def _facts(name: str) -> str:
    a = algorithm(name)
    data = ", ".join(f"[`{key}`](index.md#{key})" for key, _, _ in config.DATA_SECTIONS[a.data_path])
    rows_ = [("modes", ", ".join(a.modes)), ("action spaces", ", ".join(a.actions)), ("data path", a.data_path),
             ("data-path sections", data), ("multi-agent", "yes" if a.multi_agent else "no"),
             ("offline (learns from `data.dataset`)", "yes" if a.offline else "no"),
             ("central inference (`rollout.inference: central`)", "yes" if a.central_inference else "no"),
             ("gradient workers (`learner.num_gradient_workers`)", "yes" if a.gradient_workers else "no")]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows_)


def algo_page(name: str) -> str:
    cls = config.config_class(name)
    hints = typing.get_type_hints(cls)
    fields = {fl.name: fl for fl in dataclasses.fields(cls)}
    model_cls, own_cls = hints["model"], hints[name]
    module_doc = sys.modules[algorithm(name).__module__].__doc__ or ""
    first = " ".join(module_doc.strip().split("\n\n")[0].split())
    return "\n".join([
        f"# `{name}`\n",
        f"{first}  \n`algo: {name}` (`{ALGORITHMS[name]}`). Its config: the [run settings](index.md), "
        f"its data-path sections, and the two sections below.\n",
        _facts(name) + "\n",
        _section_block("model", model_cls, fields["model"].metadata["doc"] + f", with {name}'s defaults",
                       fields["model"].default_factory()),
        _section_block(name, own_cls, fields[name].metadata["doc"]),
    ])


def pages() -> dict[str, str]:
    """Path under docs/ -> markdown."""
    return {INDEX: index_page(), **{page_of(name): algo_page(name) for name in ALGORITHMS}}
