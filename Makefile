# Two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= configs/apex_dqn_cartpole.yaml

.PHONY: setup bytecode run test bench docs clean

$(BIN)/activate:
	$(PY) -m venv $(VENV)

# torch is pinned and installed first, by pip: this machine has a CPU wheel of exactly 2.13.0 where pip
# looks, while an unpinned torch would pull a multi-GB CUDA build. The rest goes through uv, which
# downloads, installs and byte-compiles in parallel (~25 s here, against ~45 s for pip).
$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q torch==2.13.0 uv
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

# Every role process imports distrl: its modules byte-compiled once here, not again in each process (where
# PYTHONDONTWRITEBYTECODE is set, Python would compile them in every process and keep nothing).
bytecode: setup
	$(BIN)/python -m compileall -q distrl

run: bytecode
	$(BIN)/distrl train $(CONFIG)

# Two pytest processes: many tests wait on timeouts, Ray's start or a role's restart while the other
# process uses the cores. Each test module runs whole on one process (`--dist loadfile`), so a module's
# costly fixture (a traced run, a three-node cluster) is built once, in file order; the modules that mostly
# wait run one after another on one process (WAITING_MODULES in tests/conftest.py).
test: bytecode
	$(BIN)/python -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder --durations=40

# The documentation site (mkdocs.yml): docs/ plus the pages docsgen/ generates from the code, into site/.
# --strict: a broken link, a stale reference or an example without its annotation fails the build.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[docs]'
	touch $@

# mermaid.js for the site's charts, from the npm registry (docsgen/mermaid.py ships it in site/): without it,
# Material fetches mermaid from a CDN when a page is viewed, and offline the charts show as text. Material 9
# uses mermaid 11. The file follows the Makefile, so a new MERMAID is fetched at the next build; tar's -m
# dates it now (the package's files are dated 1985, older than any Makefile).
MERMAID := 11.17.2
MERMAID_JS := $(VENV)/share/mermaid/mermaid.min.js
$(MERMAID_JS): $(BIN)/activate Makefile
	mkdir -p $(@D)
	cd $(@D) && npm pack -q mermaid@$(MERMAID) >/dev/null && tar -xzmf mermaid-$(MERMAID).tgz package/dist/mermaid.min.js \
		&& mv package/dist/mermaid.min.js mermaid.min.js && rm -r package mermaid-$(MERMAID).tgz

docs: $(VENV)/.docs-installed $(MERMAID_JS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: setup
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.solve

clean:
	rm -rf $(VENV) runs .pytest_cache site
