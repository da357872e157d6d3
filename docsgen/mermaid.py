"""MkDocs hook (mkdocs.yml `hooks:`): the site ships mermaid.js, so its charts draw with no network.
Material for MkDocs fetches mermaid from a CDN only when the page has not defined it already; mkdocs.yml's
`extra_javascript` loads this copy, which `make docs` takes from the npm registry into the venv (Makefile:
MERMAID), so the site's copy is the pinned one and no blob is committed."""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("mkdocs.hooks.mermaid")

SITE_PATH = "javascripts/mermaid.min.js"  # where the site has it: mkdocs.yml's extra_javascript names it


def source() -> str:
    """The copy `make docs` put into the environment that builds the site."""
    return os.path.join(sys.prefix, "share", "mermaid", "mermaid.min.js")


def on_config(config):
    if SITE_PATH not in [str(script) for script in config.extra_javascript]:
        log.warning(f"mkdocs.yml's extra_javascript lacks {SITE_PATH}: the charts would need a CDN")
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    if not os.path.isfile(source()):
        # a warning, so --strict fails: a site without it shows the charts as text when offline
        log.warning(f"{source()} is missing: `make docs` fetches it")
        return files
    files.append(File.generated(config, SITE_PATH, abs_src_path=source()))
    return files
