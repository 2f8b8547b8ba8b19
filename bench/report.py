"""Cost of ``matrixrl report`` (and ``report --html``) with and without the store's caches.

Fills a fresh store, through the store's own API, with a synthetic study of 200
cells (4 workflows × 5 scales × 2 policy modes × 5 seeds), 100 checkpoints each
(with per-role accuracies) and gradient diagnostics at every one of its 495
updates (every kind the trainer logs, for each workflow's roles and agents).
Then it times, in the same run:

1. a full report: every table, every cell's record computed (empty cache);
2. the same report again with nothing new (every record from the cache);
3. the report after one new evaluation of one cell (one record recomputed, from
   its cached training part and its evaluations);

and prints the times, the ratio of the full report to the incremental one, and the
same ratio of CPU time (steadier on a shared machine). The times cover building the
tables (``build_tables``); ``matrixrl report`` also scans the result files for new
ones before that. With ``--html`` it times the same three for the HTML page
(``build_report``: every table, the figures, the cards), starting again from the
store as it was filled (no record, no figure cached).

    python bench/report.py [--cells-per-axis 5] [--checkpoints 100] [--repeats 3] [--html]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

# Roles and their parallel agents in the default workflows (voting: 3 votes, orch_workers: 3 workers).
AGENTS = {
    "single": {"generator": 1},
    "voting": {"generator": 3, "aggregator": 1},
    "eval_opt": {"generator": 1, "evaluator": 1},
    "orch_workers": {"orchestrator": 1, "worker": 3, "synthesizer": 1},
}
ACCURACY = {"evaluator": "verdict_acc", "orchestrator": None}  # others: answer_acc


def config_for(folder: Path, per_axis: int, checkpoints: int, every: int):
    import yaml

    from matrixrl.config import load_config

    repo = Path(__file__).resolve().parents[1]
    raw = yaml.safe_load((repo / "experiments.yaml").read_text())
    scale = raw["scales"]["tiny-s"]
    raw["scales"] = {f"s{i}": scale for i in range(per_axis)}
    raw["grid"] = {"workflow": list(AGENTS), "task": ["arith"], "scale": list(raw["scales"]), "policy": ["shared", "isolated"], "seed": list(range(per_axis))}
    raw["train"].update(steps=(checkpoints - 1) * every, eval_every=every)
    raw["results_dir"] = "results"
    (folder / "experiments.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(folder / "experiments.yaml")


def diagnostics(rng: np.random.Generator, workflow: str, shared: bool, steps: int) -> list[dict]:
    """Rows shaped like ``gradient_diagnostics`` output (with their step), random values."""

    def row(step, kind, role=None, agent=None, other=None, value=0.0):
        return {"step": step, "kind": kind, "role": role, "agent": agent, "other": other, "value": float(value)}

    roles = AGENTS[workflow]
    rows = []
    for step in range(1, steps + 1):
        norms = {role: rng.uniform(0.5, 2.0) * n for role, n in roles.items()}
        total = sum(norms.values())
        for role, n in roles.items():
            agents = [f"{role}{i}" for i in range(n)]
            for agent in agents:
                rows.append(row(step, "agent_norm", role, agent, value=rng.uniform(0.5, 2.0)))
                rows.append(row(step, "agent_tokens", role, agent, value=rng.integers(8, 64)))
            rows.append(row(step, "role_norm", role, value=norms[role]))
            rows.append(row(step, "role_tokens", role, value=rng.integers(8, 64) * n))
            rows.append(row(step, "role_share", role, value=norms[role] / total))
            for i, a in enumerate(agents):
                for b in agents[i + 1 :]:
                    rows.append(row(step, "agent_cosine", role, a, b, value=rng.uniform(-1, 1)))
            if n > 1:
                rows.append(row(step, "amplification", role, value=rng.uniform(1.0, n)))
        if shared:
            names = sorted(roles)
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    rows.append(row(step, "role_cosine", a, None, b, value=rng.uniform(-1, 1)))
                rows.append(row(step, "role_total_cosine", a, value=rng.uniform(0, 1)))
    return rows


def history(cell, steps: list[int], rng: np.random.Generator) -> tuple[object, list]:
    """The train result (metrics, diagnostics) and every eval result of one synthetic cell."""
    from matrixrl.results import EvalResult, RoleMetric, StepMetrics, TrainResult

    n = 256
    accuracy = np.clip(0.35 + np.cumsum(rng.normal(0, 0.03, len(steps))) - 0.03 * (rng.random() < 0.5) * np.arange(len(steps)) / 10, 0, 1)
    accuracy[0] = 0.35
    evals = []
    for step, acc in zip(steps, accuracy):
        correct = int(round(acc * n))
        roles = [
            RoleMetric(role=role, metric=ACCURACY.get(role, "answer_acc"), value=float(np.clip(acc + rng.normal(0, 0.05), 0, 1)))
            for role in AGENTS[cell.workflow]
            if ACCURACY.get(role, "answer_acc")
        ]
        evals.append(EvalResult(cell=cell.id, step=step, accuracy=correct / n, n=n, n_correct=correct, seconds=0.1, roles=roles))
    metrics = [
        StepMetrics(step=s, reward_mean=0.5, reward_std=0.1, loss=0.0, entropy=1.0, response_length=4.0,
                    grad_norm=1.0, clip_fraction=0.0, group_size=8, seconds=0.1)  # fmt: skip
        for s in range(1, steps[-1] + 1)
    ]
    train = TrainResult.model_validate({
        "cell": cell.id, "axes": cell.axes(), "steps": steps[-1], "metrics": metrics,
        "diagnostics": diagnostics(rng, cell.workflow, cell.policy == "shared", steps[-1]),
    })  # fmt: skip
    return train, evals


def timed(function) -> tuple[float, float, object]:
    """``(wall seconds, CPU seconds, value)`` of ``function()``."""
    began, cpu = time.perf_counter(), time.process_time()
    value = function()
    return time.perf_counter() - began, time.process_time() - cpu, value


def phase(name: str, report, path: Path, pristine: Path, held_back, first_cell: str, repeats: int) -> object:
    """Time ``report()`` on the store as it was filled, again with nothing new, and after one new
    evaluation (``repeats`` times each); print the times and ratios; return the full report's value."""
    from matrixrl.store import Store

    shutil.copy(pristine, path)  # every cache empty
    full, full_cpu, value = timed(report)
    unchanged, incremental = [], []
    for repeat in range(repeats):
        unchanged.append(timed(report)[:2])
        new = held_back if repeat == 0 else held_back.model_copy(update={"seconds": 0.1 + repeat})
        with Store(path) as store:
            store.add_results([new])  # a new (repeat 0) or re-evaluated checkpoint of one cell
        incremental.append(timed(report)[:2])
    with Store(path) as store:
        computations = store.computations()
    recomputed = sorted(cell for cell, n in computations.items() if n > 1)
    assert recomputed == [first_cell] and computations[first_cell] == 1 + repeats, computations

    one, one_cpu = (statistics.median(times) for times in zip(*incremental))
    none = statistics.median(wall for wall, _ in unchanged)
    print(f"{name}, full (all {len(computations)} records computed):{full:8.2f} s  (cpu {full_cpu:6.2f} s)")
    print(f"{name}, nothing new (median of {repeats}):{' ' * 10}{none:8.2f} s")
    print(f"{name}, after one new evaluation (median of {repeats}):{one:8.2f} s  (cpu {one_cpu:6.2f} s; recomputed: {first_cell} only)")
    print(f"{name}: ratio full / after one new evaluation: {full / one:.1f}x (cpu {full_cpu / one_cpu:.1f}x)")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells-per-axis", type=int, default=5, help="scales and seeds (4 workflows × 2 modes × N × N cells)")
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="incremental and unchanged reports are timed this often")
    parser.add_argument("--html", action="store_true", help="also time the HTML page (report --html)")
    args = parser.parse_args()

    from matrixrl import grid as G
    from matrixrl.report.tables import build_tables
    from matrixrl.store import Store, store_path

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = config_for(folder, args.cells_per_axis, args.checkpoints, args.eval_every)
        cells = G.cells(config)
        steps = G.checkpoint_steps(config.train)
        results = Path(config.results_dir)
        results.mkdir()
        path = store_path(results)
        held_back = []  # the last checkpoint of the first cell, added later as "the new evaluation"
        began = time.perf_counter()
        with Store(path) as store:
            for cell in cells:
                train, evals = history(cell, steps, rng)
                if not held_back:
                    held_back.append(evals.pop())
                store.add_results([train, *evals])
            rows = {t: store.rows(t, [c.id for c in cells]).shape[0] for t in ("evaluations", "diagnostics", "role_metrics")}
        print(
            f"store: {len(cells)} cells × {len(steps)} checkpoints, {rows['evaluations']:,} evaluations, "
            f"{rows['diagnostics']:,} diagnostic rows, {rows['role_metrics']:,} role metrics; "
            f"filled in {time.perf_counter() - began:.0f} s, {path.stat().st_size / 1e6:.0f} MB"
        )
        pristine = folder / "filled.sqlite"
        shutil.copy(path, pristine)

        tables = phase("tables", lambda: build_tables(path, config), path, pristine, held_back[0], cells[0].id, args.repeats)
        print(f"tables: {', '.join(f'{name} {len(frame)} rows' for name, frame in tables.items())}")
        if args.html:
            from matrixrl.report.html.build import build_report

            page, pngs = phase("html", lambda: build_report(config), path, pristine, held_back[0], cells[0].id, args.repeats)
            print(f"html: {len(page) / 1e6:.1f} MB page, {len(pngs)} plots ({sum(n.startswith('curves-') for n in pngs)} curves)")


if __name__ == "__main__":
    main()
