"""The jobs that would not fit their GPU, one line each with its fixes; plan's lines on memory."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from matrixrl.gpu_memory.budget import GpuBudget
from matrixrl.gpu_memory.peak import MEMORY_JOBS, Estimate, estimate, gib, memory_estimate

_CACHE: dict = {}


def _estimate_cached(spec, job: str, gpu: int | None = None) -> Estimate | None:
    """``estimate`` of a cell for a GPU of ``gpu`` bytes, shared by cells that differ in their seed alone (the same memory)."""
    cell = spec.cell
    key = (cell.workflow, cell.task, cell.scale, cell.policy, job, gpu, spec.model_dump_json(exclude={"cell"}))
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = estimate(spec, job, gpu=gpu)
    found = _CACHE[key]
    return None if found is None else replace(found, cell=cell.id)


def _variants(spec, job: str, found: Estimate) -> Iterable[tuple[str, object]]:
    """(setting as a user writes it, the spec with it) for each change that can lower ``found``."""
    if spec.policies.adapter == "full":
        policies = spec.policies.model_copy(update={"adapter": "lora"})
        yield "policies.adapter: lora", spec.model_copy(update={"policies": policies})
    if spec.cell.policy != "shared":
        yield "policy: shared", spec.model_copy(update={"cell": replace(spec.cell, policy="shared")})
    if job == "training":
        cfg = spec.train
        tokens = (found.micro_batch_tokens if cfg.micro_batch_tokens == "auto" else cfg.micro_batch_tokens) or 1 << 20
        for value in _halvings(tokens, 128):
            yield f"train.micro_batch_tokens: {value}", spec.model_copy(
                update={"train": cfg.model_copy(update={"micro_batch_tokens": value})}
            )
        rows = cfg.rollout_batch_size or cfg.problems_per_step * cfg.group_size * 8
        for value in _halvings(rows, 1):
            yield f"train.rollout_batch_size: {value}", spec.model_copy(
                update={"train": cfg.model_copy(update={"rollout_batch_size": value})}
            )
        if spec.scale.kind == "hf" and not spec.scale.gradient_checkpointing:
            scale = spec.scale.model_copy(update={"gradient_checkpointing": True})
            yield f"scales.{spec.cell.scale}.gradient_checkpointing: true", spec.model_copy(update={"scale": scale})
    else:
        for value in _halvings(spec.eval.batch_size, 1):
            yield f"eval.batch_size: {value}", spec.model_copy(
                update={"eval": spec.eval.model_copy(update={"batch_size": value})}
            )


def _halvings(value: int, floor: int) -> list[int]:
    """``value`` halved again and again, down to ``floor``."""
    found = []
    while value // 2 >= floor:
        value //= 2
        found.append(value)
    return found


def fixes(spec, job: str, found: Estimate, budget: int, *, config: dict | None = None) -> list[str]:
    """The settings that lower ``spec``'s ``job`` estimate, most saving first, each with its
    estimate: ``policies.adapter: lora (about 41.0 GiB)``. A batch setting is given at the
    largest value that fits ``budget`` (else at its smallest)."""
    best: dict[str, tuple[int, str]] = {}
    for setting, changed in _variants(spec, job, found):
        after = estimate(changed, job, config=config, device=found.device, gpu=budget)
        if after is None or after.total >= found.total:
            continue
        name = setting.split(":")[0]
        held = best.get(name)
        fits, held_fits = after.total <= budget, held is not None and held[0] <= budget
        # A batch setting: its largest value that fits (the first one, halving), else its smallest estimate.
        if held is None or (fits and not held_fits) or (not fits and not held_fits and after.total < held[0]):
            best[name] = (after.total, setting)
    return [f"{setting} (about {gib(total)} GiB)" for total, setting in sorted(best.values())]


def unmerged_note(found: Estimate) -> str:
    """``; adapters unmerged at decode`` where the engine's merged copy would not fit, else nothing."""
    return "; adapters unmerged at decode (the merged copy does not fit)" if found.merged is False else ""


def refusal(spec, job: str, found: Estimate, budget: int) -> str:
    """The line that refuses ``spec``'s ``job``: the cell, the estimate, the GPU, the fixes."""
    return "; ".join(refusal_parts(spec, job, found, budget))


def refusal_parts(spec, job: str, found: Estimate, budget: int) -> tuple[str, str]:
    """:func:`refusal` as (what does not fit, the fix): ``matrixrl doctor`` prints them apart."""
    problem = f"{spec.cell.id}: {job} needs about {gib(found.total)} GiB, more than the {gib(budget)} GiB GPU"
    found_fixes = fixes(spec, job, found, budget)
    if not found_fixes:
        return problem, "no setting lowers it: use a GPU with more memory"
    return problem, f"use {', or '.join(found_fixes)}"


def _gpu_jobs(config, jobs: Iterable[dict] | None) -> Iterable[tuple[object, str]]:
    """(spec, job) of every training and evaluation of a GPU scale; ``jobs``: only those
    pending among these rows (``matrixrl.status.job_statuses``)."""
    from matrixrl import grid as G
    from matrixrl.models.hf import needs_gpu

    wanted = None
    if jobs is not None:
        kinds = {"train": "training", "evaluate": "evaluation"}
        wanted = {(j["cell"], kinds[j["rule"]]) for j in jobs if j["status"] == "pending" and j["rule"] in kinds}
    for cell in G.runs(config):
        if not needs_gpu(config.scales[cell.scale]):
            continue
        spec = None
        for job in ("training", "evaluation"):
            if wanted is not None and (cell.id, job) not in wanted:
                continue
            spec = spec or G.cell_spec(config, cell)
            yield spec, job


def refusals(config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None) -> list[str]:
    """One line per training or evaluation job of a GPU scale whose estimate exceeds the GPU it
    will get (``budget``: a ``GpuBudget``, or bytes for every job; None: nothing is refused).
    ``jobs``: the rows of ``matrixrl.status.job_statuses``, to refuse only pending jobs."""
    return ["; ".join(parts) for parts in refused_jobs(config, budget, jobs)]


def refused_jobs(config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None) -> list[tuple[str, str]]:
    """:func:`refusals` as (what does not fit, the fix) pairs (:func:`refusal_parts`)."""
    if budget is None:
        return []
    if isinstance(budget, int):
        budget = GpuBudget.every(budget, "given")
    found_pairs = []
    for spec, job in _gpu_jobs(config, jobs):
        limit = budget.of(job)
        if limit is None:
            continue
        found = _estimate_cached(spec, job, limit)
        if found is not None and found.total > limit:
            found_pairs.append(refusal_parts(spec, job, found, limit))
    return found_pairs


def check_fits(config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None) -> None:
    """Raise ``GpuMemoryError`` (one line per job, ``refusals``) when a job would not fit its GPU:
    what ``run`` calls before it starts anything."""
    from matrixrl.errors import GpuMemoryError

    lines = refusals(config, budget, jobs)
    if lines:
        raise GpuMemoryError("\n".join(lines))


def largest_jobs(config, budget: GpuBudget | None = None) -> tuple[dict[str, dict[str, Estimate]], dict[str, str]]:
    """Per GPU scale of the grid, the estimate of its largest training and evaluation job
    (scale → job → Estimate) on the GPUs of ``budget`` where known; and the GPU scales whose
    config.json is not on this machine (scale → its path), which have no estimate."""
    largest: dict[str, dict[str, Estimate]] = {}
    unknown: dict[str, str] = {}
    for spec, job in _gpu_jobs(config, None):
        found = _estimate_cached(spec, job, budget.of(job) if budget is not None else None)
        scale = spec.cell.scale
        if found is None:
            unknown[scale] = spec.scale.path
            continue
        held = largest.setdefault(scale, {})
        if job not in held or found.total > held[job].total:
            held[job] = found
    return largest, unknown


def memory_lines(
    config, budget: GpuBudget | int | None, jobs: Iterable[dict] | None = None, with_refusals: bool = True
) -> list[str]:
    """What ``plan`` prints about GPU memory: per GPU scale of the grid its largest training and
    evaluation job and the GPU, then (``with_refusals``) the refusals (``refusals``). Nothing for
    a grid of CPU scales."""
    from matrixrl.models.hf import needs_gpu

    if isinstance(budget, int):
        budget = GpuBudget.every(budget, "given")
    largest, unknown = largest_jobs(config, budget)
    lines = []
    for scale in config.grid.scale:
        if not needs_gpu(config.scales[scale]):
            continue
        if scale in unknown and scale not in largest:
            lines.append(
                f"GPU memory of {scale}: unknown: no config.json of {unknown[scale]} on this machine "
                f"(`hf download {unknown[scale]} config.json` fetches it)"
            )
            continue
        shown = [
            f"{job} up to about {gib(found.total)} GiB ({found.cell}: {found.at}{unmerged_note(found)})"
            for job, found in sorted(largest.get(scale, {}).items(), key=lambda item: item[0] != "training")
        ]
        lines.append(f"GPU memory of {scale}: {'; '.join(shown)}")
    if not lines:
        return []
    if budget is None or not budget.known:
        why = budget.source if budget is not None else "not asked"
        lines.append(f"GPU memory available: unknown ({why}); no job is refused")
        return lines
    sizes = {job: budget.of(job) for job in ("training", "evaluation")}
    if sizes["training"] == sizes["evaluation"]:
        lines.append(f"GPU memory available: {gib(sizes['training'])} GiB per job ({budget.source})")
    else:
        shown = ", ".join(f"{job} {gib(size) + ' GiB' if size is not None else 'unknown'}" for job, size in sizes.items())
        lines.append(f"GPU memory available: {shown} ({budget.source})")
    return lines + (refusals(config, budget, jobs) if with_refusals else [])


# --- each job's memory, as `plan --format json` carries it -------------------------------------

ESTIMATED_RULES = {"train": "training", "evaluate": "evaluation", "evaluate_base": "evaluation"}
"""The rules whose jobs have an estimate, and which estimate (a base evaluation is its first cell's
evaluation as a seed-0 shared cell, ``grid.base_eval_spec``); a memory job's rule (``MEMORY_JOBS``)
has :func:`memory_estimate`."""


MEMORY_JOBS_UNKNOWN = "no estimate for an evaluation with a memory (its guidance blocks lengthen the prompts) yet"


def job_memory(config, budget: GpuBudget | int | None, jobs: Iterable) -> list[dict | None]:
    """Per job of ``jobs`` (``matrixrl.dag.Job``), the ``gpu_memory`` object of its row in ``plan
    --format json``: None for a job that claims no GPU (tiny and ``device: cpu`` scales, and rules
    that load no model); else its estimate, the GPU it will get, whether it fits and the fix. The
    fields, memory jobs' included: docs/real-models.md, "Memory of one job".
    """
    from matrixrl import grid as G

    if isinstance(budget, int):
        budget = GpuBudget.every(budget, "given")
    budget = budget or GpuBudget(None, None, "not asked")
    found: list[dict | None] = []
    held: dict[tuple[int, str], dict] = {}  # (id of the spec, rule) → its object: a cell's evaluations share one
    for job in jobs:
        if not job.gpus:
            found.append(None)
            continue
        key = (id(job.spec), job.rule)
        if key not in held:
            kind = ESTIMATED_RULES.get(job.rule)
            if job.rule in MEMORY_JOBS:
                held[key] = _memory_job_memory(job.spec, job.rule, budget)
            elif kind is None:
                held[key] = _memory_object(None, None, budget.source, unknown=MEMORY_JOBS_UNKNOWN)
            else:
                spec = G.base_eval_spec(job.spec) if job.rule == "evaluate_base" else job.spec
                held[key] = _job_memory(spec, kind, budget)
        found.append(dict(held[key]))
    return found


def _without_config(path, limit, budget: GpuBudget) -> dict:
    """:func:`job_memory`'s object for a model whose config.json this machine lacks."""
    return _memory_object(
        None, limit, budget.source,
        unknown=f"no config.json of {path} on this machine (`hf download {path} config.json` fetches it)",
    )  # fmt: skip


def _job_memory(spec, kind: str, budget: GpuBudget) -> dict:
    limit = budget.of(kind)
    found = _estimate_cached(spec, kind, limit)
    if found is None:
        return _without_config(spec.scale.path, limit, budget)
    fix = None
    if limit is not None and found.total > limit:
        fix = refusal_parts(spec, kind, found, limit)[1]
    return _memory_object(found, limit, budget.source, fix=fix)


def _memory_job_memory(spec, rule: str, budget: GpuBudget) -> dict:
    """:func:`job_memory`'s object for a memory job; where it does not fit, the largest
    ``memory.batch_size`` that does (a memory job's one setting of its own that lowers it)."""
    limit = budget.of(rule)
    found = memory_estimate(spec, rule)
    if found is None:
        return _without_config(spec.model.scale.path, limit, budget)
    fix = None
    if limit is not None and found.total > limit:
        fix = "no setting lowers it: use a GPU with more memory"
        tried = None
        for size in _halvings(spec.batch_size, 1):
            tried = memory_estimate(spec.model_copy(update={"batch_size": size}), rule, device=found.device)
            if tried is not None and tried.total <= limit:
                fix = f"use memory.batch_size: {size} (about {gib(tried.total)} GiB)"
                break
        else:
            if tried is not None and tried.total < found.total:
                fix = f"use memory.batch_size: 1 (about {gib(tried.total)} GiB), or a GPU with more memory"
    return _memory_object(found, limit, budget.source, fix=fix)


def _memory_object(found: Estimate | None, limit: int | None, source: str, fix: str | None = None, unknown: str | None = None) -> dict:
    parts = found.parts if found is not None else None
    return {
        "total_bytes": found.total if found is not None else None,
        "tensors_bytes": found.tensors if found is not None else None,
        "dominant": max(parts, key=parts.__getitem__) if parts else None,
        "peak_at": found.at if found is not None else None,
        "parts_bytes": dict(parts) if parts is not None else None,
        "budget_bytes": limit,
        "budget_source": source,
        "fits": found.total <= limit if found is not None and limit is not None else None,
        "fix": fix,
        "unknown": unknown,
    }
