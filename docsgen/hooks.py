"""MkDocs hooks (mkdocs.yml `hooks:`): the generated pages join the site's files, and every page's examples
and references are checked (a problem is a warning, so `mkdocs build --strict` fails on it)."""
from __future__ import annotations

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # docsgen, from mkdocs

from docsgen import benchmarks, cli_ref, config_ref, examples  # noqa: E402

log = logging.getLogger("mkdocs.hooks.docsgen")


def generated_pages() -> dict[str, str]:
    """Every generated page: path under docs/ -> markdown."""
    return {**cli_ref.pages(), **config_ref.pages(), **benchmarks.pages()}


ALGORITHMS_NAV = "Config per algorithm"


def on_config(config):
    """The nav's per-algorithm config pages, one per registered algorithm."""
    from distrl.registry import ALGORITHMS

    def fill(items):
        for item in items if isinstance(items, list) else []:
            for title, value in (item.items() if isinstance(item, dict) else []):
                if title == ALGORITHMS_NAV:
                    item[title] = [{name: config_ref.page_of(name)} for name in ALGORITHMS]
                else:
                    fill(value)

    fill(config["nav"])
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, text in generated_pages().items():
        if files.get_file_from_path(path) is not None:
            log.warning(f"docs/{path} exists, but the site generates that page: remove the file")
            continue
        files.append(File.generated(config, path, content=text))
    _, linked = benchmarks.results_page()
    for name in sorted(set(benchmarks.results_files()) | set(linked)):
        files.append(File.generated(config, f"benchmarks/results/{name}",
                                    abs_src_path=os.path.join(benchmarks.RESULTS_DIR, name)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == benchmarks.RESULTS_PAGE:
        # bench/RESULTS.md records each measurement as it was made, with the keys and commands of its time
        # (a section on a replaced key names that key): only its links are checked, by mkdocs.
        return markdown
    for problem in examples.problems(markdown):
        log.warning(f"{page.file.src_uri}: {problem}")
    return markdown
