"""The package's import graph: no circles, and imports run one way down the layers.

The layers, highest first (README, "Where things live"): the CLI, the pipeline,
the stages, then the search's mathematics and run bookkeeping side by side, then
config, then I/O, then the proxies. A module may import its own layer's modules
or lower ones; two packages that share a layer do not import each other. Every
import counts, including those inside functions (deferred for speed, they are
still dependencies).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = (
    ("climb.cli",),
    ("climb.pipeline",),
    ("climb.stages",),
    ("climb.optimize", "climb.runtime"),
    ("climb.config",),
    ("climb.io",),
    ("proxies",),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports (anywhere in the file)."""
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module
                # `from pkg import sub` names a submodule when one exists
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in files else src for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # `import a.b.c` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    edges.add(t)
        graph[mod] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_of(mod: str, layers=LAYERS) -> tuple[int, str] | None:
    for i, group in enumerate(layers):
        for pkg in group:
            if mod == pkg or mod.startswith(pkg + "."):
                return i, pkg
    return None


def violations(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Imports that go up a layer, or across to a sibling package of the same layer."""
    bad = []
    for mod, edges in sorted(graph.items()):
        here = layer_of(mod, layers)
        for t in sorted(edges):
            there = layer_of(t, layers)
            if here is None or there is None:
                continue
            if there[0] < here[0]:
                bad.append(f"{mod} imports {t}, a higher layer")
            elif there[0] == here[0] and there[1] != here[1]:
                bad.append(f"{mod} imports {t}, a sibling package of its layer")
    return bad


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, ("climb", "proxies"))


def test_every_module_has_a_layer(graph):
    loose = [m for m in graph if m != "climb" and layer_of(m) is None]
    assert not loose, f"modules outside every layer: {loose}; put them in a package of LAYERS"


def test_no_import_circles(graph):
    assert circles(graph) == []


def test_imports_run_down_the_layers(graph):
    assert violations(graph) == []


def test_the_checks_see_a_circle_and_an_upward_import(tmp_path):
    """The checker itself: a made-up package with a circle and an upward import."""
    pkg = tmp_path / "toy"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "top.py").write_text("from toy.low import a\n")
    (pkg / "low" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "low" / "b.py").write_text("from .a import f\nimport toy.top\n")
    g = import_graph(tmp_path, ("toy",))
    assert g["toy.low.b"] == {"toy.low.a", "toy.top"}
    assert circles(g) == [["toy.low.a", "toy.low.b", "toy.top"]]
    assert violations(g, (("toy.top",), ("toy.low",))) == ["toy.low.b imports toy.top, a higher layer"]
