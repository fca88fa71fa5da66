"""The package's import graph: no cycles, and no import from a lower layer into a higher one.

Every `import rollwise...` counts, at module level or inside a function (a lazy import is still a dependency).
Layers, bottom to top; a package may import only packages of lower layers (or itself):

    types, config_yaml, config_rewards, in_memory, trl_names, omp_env, cpu_features  <  config, filter  <  models, config_doc  <  engine, train, sandbox  <  rewards, clients
                        <  envs  <  store  <  report, control, cluster  <  run, serve  <  cli, api  <  trl

`api` is the Python API (`rollwise.train()`), beside the CLI. `engine` is rollwise's own engine; `clients` are the other engines behind the same protocol (remote servers,
vLLM), so the engine can never reach into them. `cluster` (trainer ranks, Ray actors) sits beside `control`.

The root package `rollwise` is the public facade (it re-exports `LLM` and the types); only `cli` and `trl` (TRL's
GRPOTrainer, which calls `rollwise.train`) may use it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rollwise"

LAYERS: dict[str, int] = {
    "types": 0, "config_yaml": 0, "in_memory": 0, "cache_dir": 0, "trl_names": 0, "usercode": 0, "omp_env": 0, "cpu_features": 0,
    "config_rewards": 0,
    "config": 1, "filter": 1,
    "models": 2, "config_doc": 2,
    "engine": 3, "train": 3, "sandbox": 3,
    "rewards": 4, "clients": 4,
    "envs": 5,
    "store": 6,
    "report": 7, "control": 7, "cluster": 7,
    "run": 8, "serve": 8,
    "cli": 9, "api": 9,
    "trl": 10,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def import_edges() -> dict[str, set[str]]:
    """module -> rollwise modules it imports (`from a.b import c` points at a.b.c when that is a module)."""
    mods = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "rollwise"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "rollwise":
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            for t in targets:
                if t != mod:
                    edges[mod].add(t)
    return edges


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def test_every_package_has_a_layer():
    pkgs = {_package(m) for m in _modules()} - {"<root>"}
    assert pkgs <= set(LAYERS), f"give these packages a layer in LAYERS: {sorted(pkgs - set(LAYERS))}"


def test_no_upward_or_sideways_imports():
    bad = []
    for a, targets in import_edges().items():
        pa = _package(a)
        for b in targets:
            pb = _package(b)
            if pa == pb or pa == "<root>":
                continue
            if pb == "<root>":
                if pa not in ("cli", "trl"):
                    bad.append(f"{a} -> {b} (only cli and trl may use the facade)")
            elif LAYERS[pb] >= LAYERS[pa]:
                bad.append(f"{a} -> {b} ({pa} is layer {LAYERS[pa]}, {pb} is layer {LAYERS[pb]})")
    assert not bad, "imports that go up or sideways:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    """No cycle among modules, leaving out a package's `__init__` re-exporting its own submodules."""
    edges = import_edges()
    graph = {a: {b for b in bs if not (b.startswith(a + ".") and (SRC.parent / a.replace(".", "/")).is_dir())}
             for a, bs in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_a_planted_upward_import(tmp_path, monkeypatch):
    """The checker itself works: a lazy import of run/ from engine/ is reported."""
    fake = tmp_path / "rollwise"
    (fake / "engine").mkdir(parents=True)
    (fake / "run").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "run" / "__init__.py").write_text("")
    (fake / "engine" / "core.py").write_text("def f():\n    from rollwise.run.loop import train\n")
    (fake / "run" / "loop.py").write_text("from rollwise.engine.core import f\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    edges = import_edges()
    assert "rollwise.run.loop" in edges["rollwise.engine.core"]
    try:
        test_no_upward_or_sideways_imports()
    except AssertionError as e:
        assert "rollwise.engine.core -> rollwise.run.loop" in str(e)
    else:
        raise AssertionError("the planted upward import was not reported")
    try:
        test_no_import_cycles()
    except AssertionError as e:
        assert "rollwise.engine.core" in str(e)
    else:
        raise AssertionError("the planted cycle was not reported")


def test_test_modules_do_not_import_each_other():
    """Shared test code lives in conftest fixtures or helper modules, never in another test module."""
    tests = Path(__file__).resolve().parent
    bad = []
    for path in tests.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.rsplit(".", 1)[-1].startswith("test_") for n in names):
                bad.append(f"{path.relative_to(tests)} imports {names}")
    assert not bad, "\n".join(bad)
