"""prepare_base: a scale's base model, warm-started (tiny) or checked to load (hf)."""

from __future__ import annotations

import time
from pathlib import Path

from matrixrl.grid import BaseSpec
from matrixrl.jobs.cost import Meter
from matrixrl.results import BaseResult, write_result


def prepare_base(spec: BaseSpec, model_dir: Path, output: Path, log=print) -> BaseResult:
    if spec.scale.kind == "hf":
        return check_pretrained(spec, output, log)
    import torch

    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
    from matrixrl.tasks import build_task
    from matrixrl.train.warmstart import warm_start
    from matrixrl.workflows import WORKFLOWS, build_workflow

    meter = Meter(spec.scale_name)
    began = meter.began
    torch.set_num_threads(1)
    scale, ws = spec.scale, spec.scale.warmstart
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(scale, tokenizer, seed=ws.seed)
    tasks = [build_task(name, cfg) for name, cfg in spec.tasks.items()]
    workflows = [build_workflow(name, getattr(spec.workflows, name)) for name in sorted(WORKFLOWS)]
    n_params = sum(p.numel() for p in model.parameters())
    log(f"warm-starting {spec.scale_name} ({n_params:,} parameters) for {ws.steps} steps")

    def sample_pairs(rng, n):
        # Each example comes from a random task and a random workflow's role formats.
        pairs = []
        for _ in range(n):
            task = tasks[rng.integers(len(tasks))]
            workflow = workflows[rng.integers(len(workflows))]
            options = workflow.warmstart_pairs(task.warmstart_problems(rng, 1), rng)
            pairs.append(options[rng.integers(len(options))])
        return pairs

    def progress(step, loss):
        if (step + 1) % max(1, ws.steps // 10) == 0:
            log(f"  step {step + 1}/{ws.steps} loss {loss:.4f}")

    loss = warm_start(
        model,
        tokenizer,
        sample_pairs,
        steps=ws.steps,
        batch_size=ws.batch_size,
        lr=ws.lr,
        seed=ws.seed,
        max_length=scale.max_length,
        log=progress,
    )
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    result = BaseResult(
        scale=spec.scale_name, params=n_params, warmstart_loss=loss, seconds=time.perf_counter() - began, spec_digest=spec.digest(),
        cost=meter.cost(),
    )
    write_result(output, result)
    return result


def check_pretrained(spec: BaseSpec, output: Path, log=print) -> BaseResult:
    """An hf scale needs no preparation: fail early, with one line, if it cannot load.

    Loads the tokenizer and the config and counts the parameters on the meta device (seconds, no
    GPU memory); nothing is written to ``model_dir``.
    """
    from matrixrl.errors import ModelLoadError
    from matrixrl.models.hf import model_source

    meter = Meter(spec.scale_name)
    began = meter.began
    source = model_source(spec.scale_name, spec.scale, Path(), device="cpu")
    tokenizer = source.load_tokenizer()
    if spec.scale.prompt_style == "chat" and not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"scales.{spec.scale_name}: prompt_style chat needs a chat template, and the tokenizer of "
            f"{spec.scale.path} has none; use an instruct model or prompt_style: compact"
        )
    n_params = source.parameter_count()
    log(f"{spec.scale_name}: {spec.scale.path} loads ({n_params:,} parameters, {spec.scale.prompt_style} prompts)")
    result = BaseResult(
        scale=spec.scale_name, params=n_params, warmstart_loss=None, seconds=time.perf_counter() - began,
        model=spec.scale.path, spec_digest=spec.digest(), cost=meter.cost(),
    )
    write_result(output, result)
    return result
