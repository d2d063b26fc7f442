"""`make test` installs what the suite imports: every optional package a test skips without
(`pytest.importorskip`) comes with the `test` extra or the core dependencies.

The scan reads the tests' source (literal names, and names a test is parametrized over), so a
test added with an `importorskip` of a package the extras do not bring fails here, on any
machine, whether or not that package happens to be installed by hand.
"""
from __future__ import annotations

import ast
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared(pyproject: dict, extra: str = "test") -> set[str]:
    """The distributions the core dependencies and `extra` name (self-references expanded)."""
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    out, todo, seen = {_name(r) for r in project.get("dependencies", [])}, [extra], set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for req in extras.get(e, []):
            m = re.match(rf"{re.escape(project['name'])}\[(.+?)\]", req.strip())
            if m:
                todo += [x.strip() for x in m.group(1).split(",")]
            else:
                out.add(_name(req))
    return out


def skipped_imports(source: str) -> set[str]:
    """Top-level modules the source skips without: `pytest.importorskip("m")`, or
    `importorskip(x)` with x a parameter the test is parametrized over with literal names."""
    tree = ast.parse(source)
    out: set[str] = set()
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
        params: dict[str, list[str]] = {}
        for dec in getattr(fn, "decorator_list", []):
            if (isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "parametrize"
                    and len(dec.args) >= 2 and isinstance(dec.args[0], ast.Constant)):
                vals = [v.value for v in getattr(dec.args[1], "elts", []) if isinstance(v, ast.Constant)]
                params[str(dec.args[0].value)] = [v for v in vals if isinstance(v, str)]
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", ""))
                    == "importorskip" and call.args):
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(arg.value.split(".")[0])
            elif isinstance(arg, ast.Name) and arg.id in params:
                out.update(v.split(".")[0] for v in params[arg.id])
    return out


def closure(roots: set[str]) -> set[str]:
    """The installed distributions `roots` pull in, by their metadata (extras' requirements too,
    since `moto[server]` and the like bring theirs)."""
    out, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs]
    return out


def providers(module: str) -> set[str]:
    return {d.lower().replace("_", "-") for d in metadata.packages_distributions().get(module, [])}


def uncovered(modules: set[str], have: set[str]) -> dict[str, list[str]]:
    """The modules no distribution in `have` provides (a module not installed at all included),
    each with the distributions that provide it here."""
    return {m: sorted(providers(m)) for m in sorted(modules) if not providers(m) & have}


def _tests_modules() -> set[str]:
    return set().union(*(skipped_imports(p.read_text()) for p in TESTS.glob("*.py") if p.name != "test_extras.py"))


def test_the_scan_finds_skipped_imports():
    src = '''
import pytest
mod = pytest.importorskip("alpha.beta")
@pytest.mark.parametrize("backend", ["gamma", "delta"])
def test_x(backend):
    pytest.importorskip(backend)
'''
    assert skipped_imports(src) == {"alpha", "gamma", "delta"}


def test_declared_expands_self_references():
    pp = {"project": {"name": "climb", "dependencies": ["numpy>=1"],
                      "optional-dependencies": {"test": ["pytest>=8", "climb[a,b]"], "a": ["x_y[z]>=1"],
                                                "b": ["w ; python_version>'3'"]}}}
    assert declared(pp) == {"numpy", "pytest", "x-y", "w"}


def test_the_check_fails_on_a_package_the_extras_do_not_bring():
    """The check itself can fail: a planted importorskip of a package no extra names is caught."""
    pp = tomllib.loads((REPO / "pyproject.toml").read_text())
    have = closure(declared(pp))
    planted = skipped_imports('import pytest\npytest.importorskip("wandb")\n')
    assert "wandb" in uncovered(planted, {d for d in have if d != "wandb"})
    assert "no_such_module_anywhere" in uncovered({"no_such_module_anywhere"}, have)


def test_every_optional_import_of_the_tests_comes_with_the_test_extra():
    pp = tomllib.loads((REPO / "pyproject.toml").read_text())
    have = closure(declared(pp))
    modules = _tests_modules()
    assert modules, "the scan found no importorskip at all: it is broken"
    missing = uncovered(modules, have)
    assert not missing, (f"tests skip without {missing} (module: distributions providing it here), which neither "
                         f"the core dependencies nor the `test` extra bring; add them to [project.optional-dependencies]"
                         f" test in pyproject.toml")


@pytest.mark.parametrize("module", sorted(_tests_modules()))
def test_each_optional_import_is_installed(module):
    """What the extras name is really there after `make test`'s install: none of those tests skips."""
    import importlib.util
    assert importlib.util.find_spec(module) is not None, f"{module} is not importable; run `make install` again"
