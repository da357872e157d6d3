"""The site's navigation holds every generated page, each entry is a page, and the per-algorithm config
pages follow the registry. (A page under docs/ left out of the nav still builds: mkdocs says so, as info.)"""
import os

import yaml

from distrl.registry import ALGORITHMS
from docsgen import hooks
from docsgen.config_ref import page_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Loader(yaml.SafeLoader):
    """mkdocs.yml's `!!python/name:` tags, read as text."""


Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: suffix)


def nav_paths(items) -> list[str]:
    out = []
    for item in items:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out.extend(nav_paths(value) if isinstance(value, list) else [value])
    return out


def site_config() -> dict:
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        return hooks.on_config(yaml.load(fh, Loader=Loader))


def test_the_nav_gets_a_config_page_per_registered_algorithm():
    paths = nav_paths(site_config()["nav"])
    assert [p for p in paths if p.startswith("reference/config/") and p != "reference/config/index.md"] == \
        [page_of(name) for name in ALGORITHMS]


def test_every_generated_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    paths = set(nav_paths(site_config()["nav"]))
    written = {os.path.relpath(os.path.join(d, n), os.path.join(ROOT, "docs"))
               for d, _, names in os.walk(os.path.join(ROOT, "docs")) for n in names if n.endswith(".md")}
    generated = set(hooks.generated_pages())
    assert not written & generated  # a generated page is never also a file
    assert generated <= paths
    assert paths <= written | generated
