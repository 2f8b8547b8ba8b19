"""matrixrl's modules import one another in one direction: no import circles, no import
that runs upward through the package's layers (``LAYERS``)."""

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


LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("base", ("matrixrl.settings", "matrixrl.errors", "matrixrl.environment", "matrixrl.atomic", "matrixrl.layout", "matrixrl.results",
              "matrixrl.sandbox", "matrixrl._sandbox_child", "matrixrl._sandbox_worker", "matrixrl.plugins"),
     "settings digests, errors, atomic writes, where files live, result-file schemas, the code sandbox, registries"),
    ("tasks", ("matrixrl.tasks",), "problems and their scoring"),
    ("workflows", ("matrixrl.workflows",), "topologies and prompt styles (and the PromptGuide hook)"),
    ("models", ("matrixrl.models",), "model sources, policies, devices"),
    ("config", ("matrixrl.config",), "experiments.yaml's schema, loading, sweeps, the loss types' registry"),
    ("memcollab", ("matrixrl.memcollab",), "MemCollab's pure core and its jobs' specs: no model, no grid"),
    ("grid", ("matrixrl.grid",), "cells, runs and their specs, memory evaluations' included"),
    ("analysis", ("matrixrl.analysis",), "statistics over result tables"),
    ("train", ("matrixrl.train", "matrixrl.retention"), "the GRPO loop, its checkpoints and which of them are kept"),
    ("estimates", ("matrixrl.disk", "matrixrl.gpu_memory.model", "matrixrl.gpu_memory.workload", "matrixrl.gpu_memory.peak"),
     "disk use and a job's GPU memory and time on paper, from config.json (a job sizes its update by them)"),
    ("dag", ("matrixrl.dag",), "the job graph: every kind of job, and a grid's jobs as records"),
    ("store", ("matrixrl.store",), "the result store"),
    ("report", ("matrixrl.report",), "tables, plots and pages from the store"),
    ("jobs", ("matrixrl.jobs",), "one process per job: training, evaluation, memory jobs (they build the guides)"),
    ("run", ("matrixrl.status", "matrixrl.snake", "matrixrl.gpu_memory", "matrixrl.planning",
             "matrixrl.runner", "matrixrl.doctor"),
     "what to run (plan), running it with Snakemake, disk use, what a run needs (doctor)"),
    ("study", ("matrixrl.study",), "the Python API's Study"),
    ("export", ("matrixrl.export",), "a study exported as files"),
    ("cli", ("matrixrl.cli", "matrixrl.cli_errors", "matrixrl.__main__", "matrixrl"),
     "the command line and the package's lazy API"),
)
"""matrixrl's layers, bottom to top: ``(name, module prefixes, what it holds)``. This is the one
place they are stated (docs/architecture.md, "Layers", points here).

A module belongs to the layer of the longest prefix it matches (``matrixrl.x`` or
``matrixrl.x.*``; ``matrixrl`` alone is the package's ``__init__``). It may import modules of
its own layer and of lower ones, never of a higher one, in any form ``import_graph`` counts
(function-local and ``TYPE_CHECKING`` imports too). Within a layer, ``test_no_import_circles``
keeps the direction."""


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of ``module``'s layer (KeyError: no layer names it)."""
    best = None
    for index, (_, prefixes, _) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "matrixrl" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    if best is None:
        raise KeyError(module)
    return best[0]


def upward_imports(graph: dict[str, dict[str, str]]) -> list[str]:
    """Every import of ``graph`` from a module to one of a higher layer, one line each:
    importer (its layer) imports imported (its layer), where."""
    found = []
    for module, edges in sorted(graph.items()):
        for target, where in sorted(edges.items()):
            low, high = layer_of(module), layer_of(target)
            if high > low:
                found.append(
                    f"{module} ({LAYERS[low][0]}) imports {target} ({LAYERS[high][0]}) at {where}: an import that runs upward"
                )
    return found


def test_every_module_has_a_layer() -> None:
    graph = import_graph()
    unplaced = []
    for module in sorted(graph):
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert not unplaced, f"add these modules to a layer of tests/test_imports.py's LAYERS: {', '.join(unplaced)}"


def test_the_layer_check_names_every_upward_import() -> None:
    graph = {
        "matrixrl.train.trainer": {"matrixrl.jobs.memcollab": "matrixrl/train/trainer.py:9", "matrixrl.grid": "x:1"},
        "matrixrl.memcollab.evaluation": {"matrixrl.grid": "matrixrl/memcollab/evaluation.py:3"},
        "matrixrl.snake": {"matrixrl": "matrixrl/snake.py:81"},
        "matrixrl.grid": {"matrixrl.memcollab.specs": "matrixrl/grid.py:30"},
    }
    assert upward_imports(graph) == [
        "matrixrl.memcollab.evaluation (memcollab) imports matrixrl.grid (grid) at matrixrl/memcollab/evaluation.py:3: "
        "an import that runs upward",
        "matrixrl.snake (run) imports matrixrl (cli) at matrixrl/snake.py:81: an import that runs upward",
        "matrixrl.train.trainer (train) imports matrixrl.jobs.memcollab (jobs) at matrixrl/train/trainer.py:9: "
        "an import that runs upward",
    ]
    assert layer_of("matrixrl.retention") == layer_of("matrixrl.train.cell")
    assert layer_of("matrixrl") == layer_of("matrixrl.cli") and layer_of("matrixrl.settings") == 0


def test_no_import_runs_upward() -> None:
    graph = import_graph()
    upward = upward_imports(graph)
    assert not upward, "\n".join(upward)


def test_memory_sits_behind_its_boundary() -> None:
    """The two upward imports the memory feature once made are gone (train → jobs: the trainer
    takes a PromptGuide; memory → grid: the grid holds the memory evaluation spec), and
    training and evaluation import nothing of memory."""
    graph = import_graph()

    def imports(importers: str, imported: tuple[str, ...]) -> list[str]:
        return [
            f"{module} imports {target} at {where}"
            for module, edges in sorted(graph.items())
            if module == importers or module.startswith(importers + ".")
            for target, where in sorted(edges.items())
            if any(target == name or target.startswith(name + ".") for name in imported)
        ]

    assert imports("matrixrl.train", ("matrixrl.jobs", "matrixrl.memcollab")) == []
    assert imports("matrixrl.memcollab", ("matrixrl.grid",)) == []
    # jobs.evaluate's memory entry points read the memory's guide; the evaluation itself does not.
    source = (PACKAGE / "jobs" / "evaluate.py").read_text()
    top = [node for node in ast.parse(source).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in top if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n.startswith(("matrixrl.memcollab", "matrixrl.jobs.memcollab"))], names


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


def test_a_replan_loads_no_numpy() -> None:
    """A warm `matrixrl plan` (design lines cached) imports no numpy: tasks and workflows import it
    where they draw problems, not to annotate ``rng`` (docs/performance.md)."""
    import subprocess
    import sys

    repo = PACKAGE.parent
    probe = (
        "import sys\n"
        "from matrixrl.study import Study\n"
        f"study = Study.load({str(repo / 'experiments.yaml')!r}, only=[], set=[])\n"
        "study.selected\n"
        "print('loaded:', *sorted(m for m in ('numpy', 'pandas', 'scipy') if m in sys.modules), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=repo)
    assert proc.stderr.split("loaded:")[-1].split() == []
