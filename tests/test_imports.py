"""matrixrl's modules import one another in one direction: no import circles."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "matrixrl"


def _module_name(path: Path, package: Path) -> str:
    """``matrixrl/a/b.py`` → ``matrixrl.a.b``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, str]]:
    """Every module of ``package`` → {module it imports: where (``path:line``) it first does}.

    What counts as an edge from module M to module N:

    - ``import N`` or ``from N import x``, and their relative forms, anywhere in M's
      source: at module level, inside a function, under ``if TYPE_CHECKING:``. A lazy
      import only postpones the circle to call time; the two modules still depend on
      each other, so they count the same.
    - ``from P import x`` is an edge to the submodule ``P.x`` when that is a module of
      the package (``from matrixrl.analysis import cell``), and to ``P`` otherwise (a
      name defined in ``P``, or in its ``__init__``).
    - Only modules of the package: imports of other packages are no edges.

    A package's ``__init__`` is its own node (``matrixrl.analysis``). Importing
    ``matrixrl.a.b`` runs ``matrixrl.a``'s ``__init__`` first, but that is Python's
    loading order, not something M's source asks for, so there are no implicit edges
    from a submodule (or its importer) to its parent package. Self-edges (a package's
    ``__init__`` importing its own names) are dropped.
    """
    files = {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, {})
        is_package = path.name == "__init__.py"
        where = path.relative_to(package.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: the importing module's package, then up level - 1
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source for alias in node.names
                ]
            for target in targets:
                if target in files and target != module:
                    edges.setdefault(target, f"{where}:{node.lineno}")
    return graph


def import_circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Import circles of ``graph``, each as ``[a, b, ..., a]`` (a imports b ...).

    ``graphlib`` reports one circle at a time; each found circle's first edge is
    removed and the search repeated until none is left. So the list is empty iff the
    graph has no circle, and each entry is a real circle; circles that share a
    removed edge are listed once, not every path through a tangle of them.
    """
    remaining = {module: set(edges) for module, edges in graph.items()}
    circles = []
    while True:
        try:
            graphlib.TopologicalSorter(remaining).prepare()
        except graphlib.CycleError as error:
            # Each node of the reported list is a predecessor (here: an import) of the next.
            circle = list(reversed(error.args[1]))
            circles.append(circle)
            remaining[circle[0]].discard(circle[1])
        else:
            return circles


def test_the_import_graph_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    package = tmp_path / "matrixrl"
    (package / "pkg").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pkg" / "__init__.py").write_text("from matrixrl.pkg.a import A\n")
    (package / "pkg" / "a.py").write_text("A = 1\ndef f():\n    from . import b\n")
    (package / "pkg" / "b.py").write_text("import os\nfrom matrixrl.pkg import a\nfrom matrixrl import pkg\n")
    (package / "c.py").write_text("from .pkg import A\nimport matrixrl.pkg.b\n")
    graph = {module: set(edges) for module, edges in import_graph(package).items()}
    assert graph == {
        "matrixrl": set(),
        "matrixrl.pkg": {"matrixrl.pkg.a"},
        "matrixrl.pkg.a": {"matrixrl.pkg.b"},
        "matrixrl.pkg.b": {"matrixrl.pkg.a", "matrixrl.pkg"},
        "matrixrl.c": {"matrixrl.pkg", "matrixrl.pkg.b"},
    }
    circles = import_circles(import_graph(package))
    assert circles, "pkg.a -> pkg.b -> pkg.a is a circle (through a lazy, relative import)"
    for circle in circles:
        assert circle[0] == circle[-1] and all(b in graph[a] for a, b in zip(circle, circle[1:])), circle
    assert import_circles({"matrixrl.a": {"matrixrl.b": ""}, "matrixrl.b": {}}) == []


def test_no_import_circles() -> None:
    graph = import_graph()
    assert "matrixrl" in graph and len(graph) > 1  # the walk found the package
    circles = import_circles(graph)
    lines = []
    for circle in circles:
        where = ", ".join(graph[a][b] for a, b in zip(circle, circle[1:]))
        lines.append(f"import circle: {' -> '.join(circle)} ({where})")
    assert not circles, "\n".join(lines)


# Not pydantic: typer itself imports it to read a command's parameters.
HEAVY = ("torch", "transformers", "peft", "trl", "pandas", "matplotlib", "snakemake", "numpy", "sqlalchemy", "yaml")


def test_help_loads_no_heavy_library() -> None:
    """`matrixrl --help` and every command's help start in a fraction of a second:
    the libraries a command needs are imported by that command, not by the CLI."""
    import subprocess
    import sys

    from matrixrl.cli import app

    commands = [None, *(info.name or info.callback.__name__ for info in app.registered_commands)]
    probe = (
        "import sys\n"
        "from matrixrl.cli import app\n"
        "try:\n"
        "    app(sys.argv[1:], prog_name='matrixrl')\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print('loaded:', *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    for name in commands:
        argv = [name, "--help"] if name else ["--help"]
        proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True)
        loaded = proc.stderr.split("loaded:")[-1].split()
        assert "Usage" in proc.stdout, proc.stdout
        assert loaded == [], f"matrixrl {' '.join(argv)} imported {loaded}"


def test_no_bench_script_shadows_a_standard_module():
    """``python bench/x.py`` puts bench/ first on sys.path: a script named like a standard
    module (bench/html.py) breaks every other script whose imports reach that module."""
    import sys

    bench = Path(__file__).resolve().parent.parent / "bench"
    shadowing = sorted(p.name for p in bench.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert shadowing == [], f"rename {shadowing}: they shadow standard modules for every bench script"
