"""The docs' examples run: every `bash`, `python` and `yaml` block of every page (and of the README) is run
in the page's order, in a scratch directory of the page's own, or is titled "not run: <reason>"
(docsgen/examples.py). Commands that train get a small step budget; `distrl ...` lines run through the CLI's
own `main` in this process (the console script is `main` too), which spares each command Python's and
torch's start-up; a run in sync or async mode uses the module's one embedded Ray."""
from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys
import time

import pytest

from docsgen import examples

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
PAGES.append("README.md")
# A run in the docs trains this much here: enough for every role to start, act, learn and checkpoint once.
BUDGET = ["stop.max_env_steps=1500", "stop.max_updates=30", "stop.max_seconds=40"]


def page_blocks(page: str) -> list[examples.Block]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return examples.blocks(fh.read())


@pytest.mark.parametrize("page", PAGES)
def test_every_example_is_annotated_and_every_reference_is_current(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        assert examples.problems(fh.read()) == []


def with_budget(fn):
    """`fn` (distrl.api's train or resume) with the docs' budget appended to its overrides: the budget
    wins over the example's own stop keys and --max-seconds."""
    def budgeted(*args, overrides=None, **kwargs):
        return fn(*args, overrides=[*(overrides or []), *BUDGET], **kwargs)
    return budgeted


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The page's directory: configs/ as in the repository, the budget on every run, the path and the
    modules of the page's own files forgotten afterwards."""
    import distrl
    import distrl.api

    os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for module in (distrl, distrl.api):
        monkeypatch.setattr(module, "train", with_budget(distrl.api.train))
        monkeypatch.setattr(module, "resume", with_budget(distrl.api.resume))
    yield tmp_path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


def run_command(argv: list[str], where: str) -> None:
    import distrl.cli

    env, argv = examples.env_and_argv(argv)
    if argv[0] == "distrl":
        assert not env, f"{where}: environment variables for an in-process command: mark it not run"
        # The command's start, as the console script's import sets it: runs time their budget from it.
        distrl.cli.START = time.time()
        assert distrl.cli.main(argv[1:]) == 0, f"{where}: {shlex.join(argv)} failed"
        return
    argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
    proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{where}: {shlex.join(argv)} failed: {proc.stderr[-2000:]}"


def run_block(block: examples.Block, page: str, workdir) -> None:
    where = f"{page}:{block.line}"
    if block.kind == "file":
        path = workdir / block.title
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text + "\n")
    elif block.lang == "bash":
        for argv in examples.commands(block.text):
            run_command(argv, where)
    elif block.lang == "python":
        exec(compile(block.text, where, "exec"), {"__name__": "__docs__"})  # noqa: S102: the page's own example


RUNNABLE = [p for p in PAGES if any(b.kind in ("run", "file") and b.lang != "yaml" for b in page_blocks(p))]


@pytest.mark.parametrize("page", RUNNABLE)
def test_the_pages_examples_run(page, scratch, ray_session):
    for block in page_blocks(page):
        if block.kind in ("run", "file"):
            run_block(block, page, scratch)


PAGE = '''# A page

```bash
distrl train configs/ppo_cartpole.yaml \\
    --set ppo.lr=1e-3   # a comment
ls runs
```

1. In a list:

    ```python title="my_nets.py"
    X = 1
    ```

```bash title="not run: needs a Ray cluster"
RAY_AUTH_MODE=token distrl train configs/ppo_cartpole.yaml --address auto
```

```text
output
```
'''


def test_blocks_and_their_kinds():
    found = examples.blocks(PAGE)
    assert [(b.lang, b.kind) for b in found] == [("bash", "run"), ("python", "file"), ("bash", "skip"),
                                                 ("text", "other")]
    assert found[1].title == "my_nets.py" and found[1].text == "X = 1"
    assert found[2].reason == "needs a Ray cluster"
    assert examples.commands(found[0].text) == [
        ["distrl", "train", "configs/ppo_cartpole.yaml", "--set", "ppo.lr=1e-3"], ["ls", "runs"]]
    assert examples.env_and_argv(examples.commands(found[2].text)[0])[0] == {"RAY_AUTH_MODE": "token"}
    assert examples.problems(PAGE) == []


@pytest.mark.parametrize("text, says", [
    ("```bash title=\"not run:\"\nls\n```\n", "needs its reason"),
    ("```sh\nls\n```\n", "examples are bash, python or yaml"),
    ("```\nls\n```\n", "examples are bash, python or yaml"),
    ("```bash\ndistrl train configs/ppo_cartpole.yaml --bogus\n```\n", "unrecognized arguments: --bogus"),
    ("```bash title=\"not run: a cluster\"\ndistrl train configs/ppo_cartpole.yaml --set ppo.lrr=1\n```\n",
     "unknown config key 'ppo.lrr'"),
    ("```bash\ndistrl tune configs/ppo_cartpole.yaml --grid replay.alpha=0.5\n```\n", "learns from trajectory data"),
    ("```yaml\nreplay: {alpha: 2}\n```\n", "config key 'replay.alpha': must be <= 1.0"),
    ("Set `replay.alhpa` to 0.5.\n", "no config key replay.alhpa"),
    ("See `tests/no_such_test.py`.\n", "no such file or directory"),
])
def test_each_problem_is_found(text, says):
    found = examples.problems(text)
    assert len(found) == 1 and says in found[0], found


def test_inline_references_that_are_not_config_keys_pass():
    assert examples.problems("`summary.json`, `env.kwargs.comm_k`, `log.wandb={project: x}`, "
                             "`env.wrappers[i]`, `distrl.envs.mapf:MAPF`, `bench/results/solve_<config>.json`") == []
