"""The package's import graph: no circle among laxflow's Python modules.

Every import statement of a module counts (module level, inside a function,
under ``TYPE_CHECKING``): a circle that only type checkers follow still ties
the two modules' designs together. Read from the source with ``ast``; nothing
is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import laxflow

ROOT = Path(laxflow.__file__).parent


def _modules() -> dict[str, Path]:
    """Module name -> its file (a package's name -> its ``__init__.py``)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("laxflow",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The laxflow modules that module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # "from package import module" imports the module; "from module import name" the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        # A name that is no Python module here is a compiled extension (or not laxflow's): it imports
        # nothing back. The parent packages a submodule's import runs first are not counted: every
        # submodule imports its package so.
        found.update(t for t in targets if t in modules and t != name)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_another_that_imports_it_back():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    circles = _circles(graph)
    assert not circles, "import circles among laxflow's modules (each: the modules that import one another):\n" + \
        "\n".join(" <-> ".join(c) for c in circles)


def _package(module: str) -> str:
    """laxflow's top-level package or module that ``module`` belongs to (``laxflow.sim`` for ``laxflow.sim.x.y``)."""
    return ".".join(module.split(".")[:2])


def test_the_packages_are_layers_and_the_policies_stand_on_the_foundation_alone():
    """Between top-level packages the arrows run one way (a layering: no package imports one that
    imports it back, through any module), and ``laxflow.policy``, the pure scheduling logic the
    simulator, daemon and coordinator share, imports none of them: only the foundation."""
    modules = _modules()
    packages: dict[str, set[str]] = {_package(name): set() for name in modules}
    for name, path in modules.items():
        home = _package(name)
        packages[home].update(_package(t) for t in _imports(name, path, modules) if _package(t) != home)
    circles = _circles(packages)
    assert not circles, "packages that import one another: " + "; ".join(" <-> ".join(c) for c in circles)
    assert packages["laxflow.policy"] <= {"laxflow.errors", "laxflow.registry", "laxflow.stage"}, \
        f"laxflow.policy imports {sorted(packages['laxflow.policy'])}"


def test_the_reader_sees_a_circle_and_every_kind_of_import(tmp_path):
    """The graph the check reads: relative, function-level and TYPE_CHECKING imports all count; a
    compiled extension's (no .py) and another package's do not."""
    files = {
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "def f():\n    from . import c\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg import a\nfrom pkg._ext import f\nimport numpy\n",
    }
    modules = {"pkg": tmp_path / "__init__.py", **{f"pkg.{n[:-3]}": tmp_path / n for n in files}}
    (tmp_path / "__init__.py").write_text("")
    for n, text in files.items():
        (tmp_path / n).write_text(text)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a"}
    assert _circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
