"""Every GPU job claims its GPU and sees it alone; claims of different SLURM allocations never
meet; the fork server never starts CUDA; a GPU scale's batch sizes are part of its specs.

All on CPU: visible GPUs are faked with ``CUDA_VISIBLE_DEVICES``, the claims are real
``flock`` locks in a temporary lock folder, and the jobs' model loading is replaced by
a probe that records what the job would load onto.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from matrixrl import grid as G
from matrixrl.config import HfScale, TinyScale, load_config
from matrixrl.errors import GpuClaimError
from matrixrl.memcollab.specs import BankSpec, CollectSpec, DistillSpec, LabelSpec, Retrieval, TrainMemory
from matrixrl.models.devices import ALLOCATOR_ENVS, claim_gpu, claimed_gpu
from matrixrl.settings import science, settings_digest

from conftest import EXPERIMENTS, REPO

GPU = HfScale(kind="hf", path="Qwen/Qwen3-0.6B")  # device: auto, a GPU when one is visible
ON_CPU = HfScale(kind="hf", path="Qwen/Qwen3-0.6B", device="cpu")


@pytest.fixture
def two_gpus(tmp_path, monkeypatch) -> Path:
    """A machine with GPUs 0 and 1 (as CUDA_VISIBLE_DEVICES says), outside SLURM; its lock folder."""
    locks = tmp_path / "locks"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("MATRIXRL_GPU_LOCK_DIR", str(locks))
    monkeypatch.setenv("MATRIXRL_GPU_WAIT_S", "0")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return locks


def config_with_hf_scales(tmp_path: Path, *sets: str):
    raw = yaml.safe_load(EXPERIMENTS.read_text())
    raw["scales"].update({"qwen": {"kind": "hf", "path": "Qwen/Qwen3-0.6B"}, "qwen-cpu": {"kind": "hf", "path": "Qwen/Qwen3-0.6B", "device": "cpu"}})
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(path, sets=["grid.scale=[tiny-s, qwen, qwen-cpu]", "grid.task=[arith]", *sets])


def cell_specs(cfg) -> dict[str, G.CellSpec]:
    """One cell spec per scale (single, arith, shared, seed 0)."""
    return {c.scale: G.cell_spec(cfg, c) for c in G.cells(cfg) if c.workflow == "single" and c.policy == "shared"}


# --- the claim ----------------------------------------------------------------------------


def test_a_gpu_job_claims_a_free_gpu_and_sees_it_alone(two_gpus, monkeypatch):
    for name in ALLOCATOR_ENVS:
        monkeypatch.delenv(name, raising=False)
    held = claim_gpu(wait_s=0)  # another job holds GPU 0
    try:
        logs = []
        with claimed_gpu(TinyScale(kind="tiny"), GPU, log=logs.append) as device:
            assert (device, os.environ["CUDA_VISIBLE_DEVICES"]) == ("cuda", "1")
            assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert logs == [
            "claimed GPU 1 (CUDA_VISIBLE_DEVICES=1 in this job; allocator PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
        ]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # restored, and GPU 1 free again
        assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
        claim_gpu(wait_s=0).release()
        for scales in [(TinyScale(kind="tiny"),), (ON_CPU,), ()]:  # nothing to claim: the scale's own device
            with claimed_gpu(*scales) as device:
                assert (device, os.environ["CUDA_VISIBLE_DEVICES"]) == (None, "0,1")
    finally:
        held.release()
    with pytest.raises(GpuClaimError, match=r"all 2 GPUs \(0, 1\) stayed claimed"):  # both held: none for a third
        with claim_gpu(wait_s=0), claim_gpu(wait_s=0), claimed_gpu(GPU):
            pass


@pytest.mark.parametrize("name", ALLOCATOR_ENVS)
def test_a_gpu_job_keeps_the_allocator_settings_the_environment_gives(two_gpus, monkeypatch, name):
    for other in ALLOCATOR_ENVS:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, "max_split_size_mb:512")
    logs = []
    with claimed_gpu(GPU, log=logs.append):
        assert {n: os.environ.get(n) for n in ALLOCATOR_ENVS} == {
            n: "max_split_size_mb:512" if n == name else None for n in ALLOCATOR_ENVS
        }
    assert logs == [f"claimed GPU 0 (CUDA_VISIBLE_DEVICES=0 in this job; allocator {name}=max_split_size_mb:512 (from the environment))"]


def test_a_claim_refuses_once_cuda_has_started(two_gpus, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(GpuClaimError) as exc:
        with claimed_gpu(GPU):
            pass
    assert str(exc.value) == (
        "CUDA started in this job before it claimed its GPU, so CUDA_VISIBLE_DEVICES can no longer confine it to "
        "one GPU; claim the GPU (matrixrl.models.devices.claimed_gpu) before anything touches CUDA"
    )
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and not list(two_gpus.glob("*.lock"))  # nothing claimed
    with claimed_gpu(TinyScale(kind="tiny")) as device:  # a CPU job has nothing to confine
        assert device is None


SLURM_HOLDER = """
import sys
from matrixrl.models.devices import claim_gpu
claim = claim_gpu(wait_s=0)
print(claim.gpu, flush=True)
sys.stdin.readline()  # hold the GPU until the test says so
"""


def test_jobs_of_two_slurm_allocations_on_one_node_never_wait_on_each_other(tmp_path, monkeypatch):
    # With cgroup-constrained devices every allocation sees its own GPU as 0.
    locks = tmp_path / "locks"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("MATRIXRL_GPU_LOCK_DIR", str(locks))
    env = {**os.environ, "SLURM_JOB_ID": "101"}
    holder = subprocess.Popen(
        [sys.executable, "-c", SLURM_HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().split() == ["0"]  # a job of allocation 101 holds its GPU 0
        monkeypatch.setenv("SLURM_JOB_ID", "202")
        with claim_gpu(wait_s=0) as other:  # allocation 202's GPU 0, another GPU: free at once
            assert other.gpu == "0"
            assert sorted(p.name for p in locks.iterdir()) == ["gpu-slurm101-0.lock", "gpu-slurm202-0.lock"]
        monkeypatch.setenv("SLURM_JOB_ID", "101")
        with pytest.raises(GpuClaimError, match="all 1 GPUs"):  # a second job of allocation 101 waits its turn
            claim_gpu(wait_s=0.2, poll_s=0.05)
    finally:
        holder.kill()
        holder.wait()


# --- the jobs -----------------------------------------------------------------------------


class Loaded(Exception):
    """Raised by the probe that stands in for a job's model loading: what it would load onto."""


def _probe(device=None, **_):
    raise Loaded(device, os.environ.get("CUDA_VISIBLE_DEVICES"))


@pytest.mark.parametrize("job", ["evaluate", "evaluate_base"])
def test_an_evaluation_loads_onto_the_gpu_it_claimed(job, two_gpus, tmp_path, monkeypatch):
    from matrixrl.jobs import evaluate

    monkeypatch.setattr(evaluate, "_evaluate", lambda *args, device, **kw: _probe(device))
    spec = cell_specs(config_with_hf_scales(tmp_path))["qwen"]
    held = claim_gpu(wait_s=0)  # a training holds GPU 0
    try:
        with pytest.raises(Loaded) as loaded:
            if job == "evaluate":
                evaluate.evaluate(spec, 1, tmp_path, tmp_path, tmp_path / "out.json", log=lambda _: None)
            else:
                evaluate.evaluate_base(spec, tmp_path, tmp_path / "out.json", log=lambda _: None)
    finally:
        held.release()
    # Onto "cuda", with GPU 1 alone visible: PEFT's adapters, loaded onto cuda:0, land there too.
    assert loaded.value.args == ("cuda", "1")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_memory_jobs_load_onto_the_gpu_they_claimed(two_gpus, tmp_path, monkeypatch):
    from matrixrl.jobs import memcollab

    monkeypatch.setattr(memcollab, "_load", lambda *args, **kw: _probe())
    cfg = config_with_hf_scales(tmp_path)
    common = dict(task_name="arith", task=cfg.tasks["arith"], prompts=cfg.prompts, problems=2, seed=0, max_new_tokens=4)
    quiet = lambda _: None  # noqa: E731
    for scale, expected in [("qwen", "0"), ("qwen-cpu", "0,1")]:  # a CPU scale claims nothing
        model = G.memory_model(cfg, scale)
        jobs = {
            "collect": lambda: memcollab.collect(CollectSpec(model=model, samples=1, temperature=0.0, **common), tmp_path, tmp_path / "t.json", log=quiet),
            "label": lambda: memcollab.label(LabelSpec(model=model, **common), tmp_path, tmp_path / "l.json", log=quiet),
            "distill": lambda: memcollab.distill(DistillSpec(
                model=model, bank=f"own-{scale}", mode="own", consumer=scale, weak=scale, strong="qwen",
                collections={}, entries_per_problem=2, prefix="When", **common,
            ), tmp_path, [], tmp_path / "d.json", log=quiet),
        }
        for name, run in jobs.items():
            with pytest.raises(Loaded) as loaded:
                run()
            assert loaded.value.args[1] == expected, (scale, name)
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # released: the next job claims GPU 0 again


def test_training_claims_one_gpu_for_its_model_and_its_labeller(two_gpus, tmp_path, monkeypatch):
    import types

    from matrixrl.jobs.train import train

    # Stands in for the trainer (heavy to import): records what the cell would load onto.
    fake = types.ModuleType("matrixrl.train.trainer")
    fake.train_cell = lambda *args, **kw: _probe()
    monkeypatch.setitem(sys.modules, "matrixrl.train.trainer", fake)
    cfg = config_with_hf_scales(tmp_path)
    specs = cell_specs(cfg)
    labeller = TrainMemory(
        mode="own", bank=BankSpec(task_name="arith", bank="own-tiny-s", distilled="d", labels="l"),
        labeller=G.memory_model(cfg, "qwen"), label_max_new_tokens=8,
        retrieval=Retrieval(top_p=1, per_problem=1, limit=None, roles=("generator",)),
    )
    tiny = specs["tiny-s"]
    with_labeller = G.CellSpec(**{**{name: getattr(tiny, name) for name in G.CellSpec.model_fields}, "memory": labeller})
    for spec, expected in [(specs["qwen"], "0"), (tiny, "0,1"), (with_labeller, "0")]:
        with pytest.raises(Loaded) as loaded:
            train(spec, tmp_path, tmp_path / "cell", tmp_path / "train.json", log=lambda _: None)
        assert loaded.value.args[1] == expected, spec.cell.id


# --- the fork server ----------------------------------------------------------------------

# A machine whose torch has CUDA, on which starting CUDA fails and NVML counts 2 GPUs: the
# fork server's preload must succeed, and so must a library's torch.cuda.is_available() there.
PRELOAD_WITHOUT_CUDA = """
import importlib
import torch

def started(*args, **kwargs):
    raise RuntimeError("CUDA started in the fork server")

# _cuda_getDeviceCount is what is_available() asks by default (cuInit); the others are the
# names that make torch.cuda count as built with CUDA on a CPU-only torch.
for name in ("_cuda_getDeviceCount", "_cuda_init", "_cuda_getCurrentRawStream"):
    setattr(torch._C, name, started)
torch.cuda._lazy_init = started
torch.cuda._device_count_nvml = lambda: 2

from matrixrl.jobs import forked

for module in forked.PRELOAD:
    importlib.import_module(module)
assert torch.cuda.is_available() and not torch.cuda.is_initialized()
print("preloaded")
"""


def test_the_fork_servers_preload_never_starts_cuda():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    proc = subprocess.run(
        [sys.executable, "-c", PRELOAD_WITHOUT_CUDA], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "preloaded"


# --- batch sizes in the specs -------------------------------------------------------------


def test_a_gpu_scales_batch_size_is_part_of_its_evaluations_spec(tmp_path):
    before, after = (cell_specs(config_with_hf_scales(tmp_path, *sets)) for sets in ([], ["eval.batch_size=7"]))
    for scale in ("tiny-s", "qwen-cpu"):  # on CPU, keyed samples do not depend on it: nothing reruns
        a, b = before[scale], after[scale]
        assert a.eval_digest() == b.eval_digest() == settings_digest(a.science)  # the digest results recorded
        assert G.base_eval_digest(a) == G.base_eval_digest(b)
    a, b = before["qwen"], after["qwen"]
    assert a.eval_digest() == settings_digest(a.science)  # at the default: what results computed there recorded
    assert a.eval_digest() != b.eval_digest() and G.base_eval_digest(a) != G.base_eval_digest(b)
    assert a.train_digest() == b.train_digest()  # training does not evaluate: it keeps its checkpoints
    for specs in (before, after):  # a report's digests are the evaluations' own
        cells = [spec.cell for spec in specs.values()]
        cfg = config_with_hf_scales(tmp_path, *([] if specs is before else ["eval.batch_size=7"]))
        assert {cell_id: d[1] for cell_id, d in G.spec_digests(cfg, cells).items()} == {
            spec.cell.id: spec.eval_digest() for spec in specs.values()
        }


def test_a_gpu_scales_memory_batch_size_is_part_of_its_memory_jobs_specs(tmp_path):
    cfg = config_with_hf_scales(tmp_path)
    common = dict(task_name="arith", task=cfg.tasks["arith"], prompts=cfg.prompts, problems=2, seed=0, max_new_tokens=4)
    for scale, changes in [("qwen", True), ("qwen-cpu", False)]:
        digests = {
            LabelSpec(model=G.memory_model(cfg, scale), batch_size=batch, threads=threads, **common).digest()
            for batch, threads in [(16, 1), (7, 1), (16, 2)]
        }
        assert len(digests) == (2 if changes else 1), scale  # threads never change a result
    default = LabelSpec(model=G.memory_model(cfg, "qwen"), **common)
    assert default.digest() == settings_digest(
        {k: v for k, v in science(default).items() if k not in ("batch_size", "threads", "model")}
        | {"model": default.model.science_view()}
    )  # at the default: the digest of before batch sizes counted
