"""The architecture as rules: imports run one way, no cycles, ray only in the runtime, small modules.

Imports are read from the source (function-level ones included), so a deferred
import cannot hide a cycle.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "distrl")

# cli -> api -> runtime -> roles -> (algos, models, replay, envs, checkpoint, observe, data) -> core layer (with
# distrl.client, a simulator's side, and distrl.sampling, the acting rules it shares with the policies).
LAYERS = [
    {"distrl.core", "distrl.tree", "distrl.acting", "distrl.config", "distrl.registry", "distrl.threads", "distrl.version",
     "distrl.sampling", "distrl.client"},
    {"distrl.algos", "distrl.models", "distrl.replay", "distrl.envs", "distrl.checkpoint", "distrl.observe", "distrl.data"},
    {"distrl.roles"},
    {"distrl.runtime"},
    {"distrl.checks"},
    {"distrl.api"},
    {"distrl.cli", "distrl"},
]


def modules() -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(d, name)
                mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[mod.removesuffix(".__init__")] = path
    return out


MODULES = modules()


def imports_of(path: str) -> set[str]:
    """distrl modules imported anywhere in the file (resolved to modules that exist)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from distrl import tree` depends on the module distrl.tree (the package's __init__ runs before
            # any of its modules alike), `from distrl.core import Batch` on the module distrl.core
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = subs if all(s in MODULES for s in subs) else [node.module] + subs
        for name in names:
            if name.startswith("distrl") and name in MODULES:
                found.add(name)
    return found


def layer(mod: str) -> int:
    for i, group in enumerate(LAYERS):
        if any(mod == g or mod.startswith(g + ".") for g in group if g != "distrl") or mod in group:
            return i
    raise AssertionError(f"{mod} is in no layer: add it to LAYERS")


GRAPH = {mod: imports_of(path) - {mod} for mod, path in MODULES.items()}


def test_imports_never_point_up_a_layer():
    wrong = [f"{m} (layer {layer(m)}) imports {d} (layer {layer(d)})"
             for m, deps in GRAPH.items() for d in deps if layer(d) > layer(m)]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in GRAPH[m]:
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


def test_only_the_runtime_imports_ray():
    for mod, path in MODULES.items():
        tree = ast.parse(open(path).read())
        uses_ray = any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "ray" for a in n.names)
                       or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "ray"
                       for n in ast.walk(tree))
        assert not uses_ray or mod.startswith("distrl.runtime"), mod


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_modules_and_functions_are_small(mod):
    source = open(MODULES[mod]).read()
    assert source.count("\n") <= 400, f"{mod}: {source.count(chr(10))} lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= 60, f"{mod}.{node.name}: {length} lines"


def test_the_modules_make_test_runs_together_exist():
    """tests/conftest.py names the modules that mostly wait; a renamed one would silently run beside another."""
    from tests.conftest import WAITING_MODULES

    assert all(os.path.isfile(os.path.join(ROOT, path)) for path in WAITING_MODULES), WAITING_MODULES
