"""`matrixrl doctor` on CPU: the default grid passes every check, and each ✗ line (a missing
or uncached model, a GPU too small, no GPU, no SLURM, a short disk, a read-only results
folder, a weak sandbox) says what it found and the fix."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_cli

QWEN3 = json.loads((REPO / "tests" / "fixtures" / "qwen3_configs.json").read_text())
PAPER = REPO / "examples" / "paper.yaml"
H100_MIB = 81_559  # nvidia-smi's memory.total of an H100 80GB
CHAT = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"


def lines_of(checks) -> list[str]:
    return [check.line() for check in checks]


def strong_sandbox() -> bool:
    """Whether this machine's sandbox isolation is the strongest doctor asks for."""
    from matrixrl import sandbox

    return sandbox.isolation()[0] == "view"


# --- the default grid ------------------------------------------------------------------------


def test_the_default_grid_passes_every_check_on_cpu(experiment):
    """Tiny scales only: a CPU build of torch and no GPU pass. Where this machine's sandbox
    falls short (no namespaces, or root without the uid drop), that line alone fails."""
    import torch

    from matrixrl.config import load_config
    from matrixrl.disk import disk_at_peak
    from matrixrl.gpu_memory import gib
    from matrixrl.gpu_memory.budget import local_gpu_memory
    from matrixrl.models.versions import REQUIRED, installed_version
    from matrixrl.planning import jobs_at_once
    from matrixrl.retention import format_bytes

    result = run_cli("doctor", "-c", experiment)
    lines = result.stdout.splitlines()
    folder = experiment.parent
    memory, source = local_gpu_memory()
    here = f"{gib(memory)} GiB per job ({source})" if memory is not None else source
    build = "a CPU build" if torch.version.cuda is None else f"a CUDA {torch.version.cuda} build"
    libraries = ", ".join(f"{name} {installed_version(name)}" for name in REQUIRED)
    assert lines[:5] == [
        f"✓ torch: {torch.__version__}, {build}: every scale of the grid runs on CPU",
        f"✓ libraries: {libraries}: within matrixrl's requirements",
        f"✓ GPUs: none needed: the grid has no GPU scale; here: {here}",
        "✓ models: no hf scale in the grid: its tiny models are built by the run",
        "✓ GPU memory: nothing to estimate: the grid has no GPU scale",
    ]
    sandbox = re.fullmatch(r"([✓✗]) sandbox: (view|namespaces\+uid|namespaces|uid|none): .*a test program passed in \d+\.\d\d s.*", lines[5])
    assert sandbox, lines[5]
    assert (sandbox[1] == "✓") == strong_sandbox()
    assert "network and PID namespaces" in lines[5] or "namespaces" not in sandbox[2]
    peak = disk_at_peak(load_config(experiment), jobs_at_once(None)).peak
    assert lines[6:9] == [
        "✓ SLURM: not used: jobs run on this machine (no --profile)",
        lines[7],
        f"✓ results folder: {folder / 'results'} does not exist yet, and {folder} lets the run create it",
    ]
    free = re.fullmatch(rf"✓ disk: (.+) free at {re.escape(str(folder))}; the checkpoints need ~(.+) more at the run's peak", lines[7])
    assert free and free[2] == format_bytes(peak), lines[7]
    if strong_sandbox():
        assert result.exit_code == 0, result.output
        assert lines[9:] == ["All 9 checks pass: `matrixrl plan` shows the jobs, `matrixrl run` runs them."]
    else:
        assert result.exit_code == 1 and lines[9:] == ["1 of 9 checks fail."], result.output
    assert not (folder / "results").exists()  # nothing left behind


def test_a_library_outside_its_requirement_fails_with_the_install_that_fixes_it(experiment, monkeypatch):
    """A GPU image's preinstalled transformers, older than the first whose models take `cache=`."""
    from matrixrl.config import load_config
    from matrixrl.doctor import check_libraries
    from matrixrl.models import versions

    found, real = {"transformers": "5.17.0"}, versions.installed_version  # the others as installed
    monkeypatch.setattr(versions, "installed_version", lambda name: found[name] if name in found else real(name))
    assert lines_of(check_libraries(load_config(experiment), None)) == [
        "✗ libraries: transformers 5.17.0 is outside matrixrl's requirement >=5.24,<6: 5.24 is the first whose models "
        "take the KV cache as `cache=` (older ones ignore the argument, and rollouts decode without their cache); "
        "fix: pip install 'transformers>=5.24,<6'"
    ]
    found["transformers"] = None
    assert lines_of(check_libraries(load_config(experiment), None))[0] == (
        "✗ libraries: transformers is not installed; fix: pip install 'transformers>=5.24,<6'"
    )
    found.update(transformers=None, torch="2.5.1")
    assert lines_of(check_libraries(load_config(experiment), None))[1] == (
        "✗ libraries: torch 2.5.1 is outside matrixrl's requirement >=2.6: transformers 5 turns PyTorch off below 2.6 "
        "(it logs it once), and no model loads; fix: install torch first and pinned, e.g. pip install torch==2.13.0 "
        "(a looser spec can pull a multi-GB CUDA build), then pip install -e ."
    )


def test_a_package_missing_is_a_line_with_the_extra_that_brings_it(experiment, monkeypatch):
    """An image installed with --no-deps, or a wheel folder short of one: each missing dependency of
    matrixrl, and the hub extra's datasets where a task reads the hub (examples/paper.yaml's GSM8K);
    offline (HF_HUB_OFFLINE=1), the fix brings the wheel from a login node."""
    from matrixrl.config import load_config
    from matrixrl.doctor import check_libraries
    from matrixrl.models import versions

    real = versions.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda name: None if name in ("peft", "datasets") else real(name))
    wheels = (
        " (without network here: pip download '{spec}' -d wheels on a login node, with this machine's Python, then "
        "pip install --no-index --find-links wheels '{spec}' here)"
    )
    assert lines_of(check_libraries(load_config(PAPER, only=["task=gsm8k"]), None)) == [
        "✗ libraries: peft is not installed (peft>=0.21), and matrixrl requires it; fix: pip install 'peft>=0.21'"
        + wheels.format(spec="peft>=0.21"),
        "✗ libraries: the hub extra's datasets is not installed (datasets>=4.7), and task gsm8k reads the hub; fix: "
        "pip install 'matrixrl[hub]'" + wheels.format(spec="datasets>=4.7"),
    ]
    monkeypatch.delenv("HF_HUB_OFFLINE")  # with network here, and no task on the hub: peft alone, installed here
    assert lines_of(check_libraries(load_config(experiment), None)) == [
        "✗ libraries: peft is not installed (peft>=0.21), and matrixrl requires it; fix: pip install 'peft>=0.21'"
    ]


def test_a_failing_check_exits_1(experiment, hub_cache):
    result = run_cli("doctor", "-c", experiment, "--set", "scales.tiny-s={kind: hf, path: acme/uncached, device: cpu}")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert (
        f"✗ model tiny-s: acme/uncached is not in the local Hugging Face cache ({hub_cache}), and this machine is offline "
        "(HF_HUB_OFFLINE=1): no config, tokenizer or weights; fix: on a machine with network (a login node): hf download "
        f"acme/uncached --cache-dir {hub_cache} (a folder both machines see), or hf download acme/uncached --local-dir "
        "DIR, then copy DIR here and set scales.tiny-s.path: DIR"
    ) in lines
    assert [line[0] for line in lines[:-1]].count("✗") == 2 + (not strong_sandbox())  # the model, and the disk it sizes
    assert lines[-1] == f"{2 + (not strong_sandbox())} of {len(lines) - 1} checks fail."


def test_a_missing_model_folder_or_profile_is_one_error_line(experiment, tmp_path):
    """Neither is a check: the experiments file's folder is checked as it loads, the profile
    before any check, as plan and run do."""
    assignment = f"scales.tiny-s={{kind: hf, path: {tmp_path / 'gone'}}}"
    result = run_cli("doctor", "-c", experiment, "--set", assignment)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith(f"Error: {experiment} with --set {assignment!r}: scales.tiny-s.path: no folder {tmp_path / 'gone'}; ")
    result = run_cli("doctor", "-c", experiment, "--profile", tmp_path / "none")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        f"Error: --profile {tmp_path / 'none'}: no such folder; pass a Snakemake profile folder such as profiles/slurm\n"
    )


# --- torch and the GPUs ----------------------------------------------------------------------


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """``fake_smi(mib, cuda)``: an nvidia-smi on PATH reporting one GPU of ``mib`` MiB and a
    driver that runs CUDA ``cuda``."""
    bin_dir = tmp_path / "smi-bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(mib: int = H100_MIB, cuda: str = "12.8") -> None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(
            "#!/bin/sh\ncase \"$*\" in\n"
            f"  *memory.total*) printf '0, GPU-aaa, {mib}\\n' ;;\n"
            "  *index*) printf '0\\n' ;;\n"
            f"  *) printf '| NVIDIA-SMI 570.86    Driver Version: 570.86    CUDA Version: {cuda} |\\n' ;;\n"
            "esac\n"
        )
        smi.chmod(0o755)

    return install


def qwen3_grid(tmp_path: Path, *sets: str, only=("workflow=voting", "task=gsm8k", "scale=qwen3-4b", "policy=isolated")):
    """examples/paper.yaml with Qwen3-4B's config.json in a folder of its own (no weights, no tokenizer)."""
    from matrixrl.config import load_config

    folder = tmp_path / "qwen3-4b"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(QWEN3["qwen3-4b"]))
    return load_config(PAPER, sets=[f"scales.qwen3-4b.path={folder}", *sets], only=list(only))


def test_torch_without_a_cuda_build_fails_a_grid_of_gpu_scales(tmp_path, monkeypatch):
    import torch

    from matrixrl.doctor import check_torch

    monkeypatch.setattr(torch.version, "cuda", None)
    release = torch.__version__.split("+")[0]
    assert lines_of(check_torch(qwen3_grid(tmp_path), None)) == [
        f"✗ torch: {torch.__version__} has no CUDA build, and scale qwen3-4b runs on a GPU; fix: pip install "
        f"torch=={release} --index-url https://download.pytorch.org/whl/cu128 (a CUDA build), or set "
        "scales.qwen3-4b.device: cpu to run it on CPU"
    ]
    on_cpu = qwen3_grid(tmp_path, "scales.qwen3-4b.device=cpu")
    assert lines_of(check_torch(on_cpu, None)) == [f"✓ torch: {torch.__version__}, a CPU build: every scale of the grid runs on CPU"]


def test_a_cuda_build_must_suit_the_driver_and_see_the_gpus(tmp_path, monkeypatch, fake_smi):
    import torch

    from matrixrl import doctor

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    config = qwen3_grid(tmp_path)
    fake_smi(cuda="11.8")
    assert lines_of(doctor.check_torch(config, None)) == [
        f"✗ torch: {torch.__version__} is built for CUDA 12.8, newer than the NVIDIA driver's CUDA 11.8; fix: install a "
        f"torch {torch.__version__.split('+')[0]} built for CUDA 11.x (pytorch.org lists them), or update the NVIDIA driver"
    ]
    fake_smi(cuda="12.4")  # torch here is a CPU build whatever torch.version says: it sees no GPU
    assert lines_of(doctor.check_torch(config, None)) == [
        f"✗ torch: {torch.__version__} (CUDA 12.8) sees no GPU, while nvidia-smi lists 1; fix: check the NVIDIA driver "
        "and that this environment's torch is the CUDA build you installed (python -c 'import torch; "
        "print(torch.cuda.is_available())')"
    ]
    assert not torch.cuda.is_initialized()
    monkeypatch.setattr(doctor, "_torch_sees_gpu", lambda torch: True)
    assert lines_of(doctor.check_torch(config, None)) == [
        f"✓ torch: {torch.__version__}, a CUDA 12.8 build, the driver runs CUDA 12.4"
    ]


def test_a_gpu_scale_needs_a_visible_gpu(tmp_path, monkeypatch, fake_smi):
    from matrixrl.doctor import check_gpus

    config = qwen3_grid(tmp_path)
    fake_smi()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert lines_of(check_gpus(config, None)) == [
        "✗ GPUs: none here: no GPU visible (CUDA_VISIBLE_DEVICES or nvidia-smi), but scale qwen3-4b runs on a GPU; "
        "fix: run on a machine whose GPUs nvidia-smi lists (and CUDA_VISIBLE_DEVICES does not hide), or set "
        "scales.qwen3-4b.device: cpu to run it on CPU"
    ]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert lines_of(check_gpus(config, None)) == ["✓ GPUs: 79.6 GiB per job (nvidia-smi: the GPU)"]
    profile = write_profile(tmp_path / "profile", {"executor": "slurm"})
    assert lines_of(check_gpus(config, profile)) == [
        f"✓ GPUs: not checked here: profile {profile} runs the jobs on the cluster's nodes (executor: slurm); "
        "GPU memory below is what it declares"
    ]


# --- GPU memory ------------------------------------------------------------------------------


def test_the_largest_job_against_a_gpu_too_small_fails_with_the_fixes(tmp_path, fake_smi):
    from matrixrl.doctor import check_gpu_memory

    fake_smi(H100_MIB)
    assert lines_of(check_gpu_memory(qwen3_grid(tmp_path, "policies.adapter=full"), None)) == [
        # paper.yaml's micro_batch_tokens: auto, at its smallest (256) where nothing fits this GPU
        "✗ GPU memory: voting-gsm8k-qwen3-4b-isolated-s0: training needs about 197.7 GiB, more than the 79.6 GiB GPU; "
        "fix: use policies.adapter: lora (about 60.7 GiB), or policy: shared (about 148.8 GiB), or "
        "train.rollout_batch_size: 32 (about 185.9 GiB)",
        "✗ GPU memory: voting-gsm8k-qwen3-4b-isolated-s0: evaluation needs about 92.9 GiB, more than the 79.6 GiB GPU; "
        "fix: use policies.adapter: lora (about 57.4 GiB), or eval.batch_size: 32 (about 67.6 GiB), or policy: shared "
        "(about 76.4 GiB)",
    ]
    (line,) = lines_of(check_gpu_memory(qwen3_grid(tmp_path), None))  # LoRA fits
    assert re.fullmatch(
        r"✓ GPU memory: training up to about 60\.7 GiB \(voting-gsm8k-qwen3-4b-isolated-s0: .+\), evaluation up to "
        r"about 57\.4 GiB \(voting-gsm8k-qwen3-4b-isolated-s0: .+\): within the 79\.6 GiB GPU \(nvidia-smi: the GPU\)",
        line,
    ), line


def test_an_unknown_gpu_memory_fails(tmp_path, monkeypatch):
    from matrixrl.doctor import check_gpu_memory

    monkeypatch.setenv("PATH", str(tmp_path / "no-smi"))  # no nvidia-smi
    (line,) = lines_of(check_gpu_memory(qwen3_grid(tmp_path), None))
    assert line.startswith("✗ GPU memory: training up to about 60.7 GiB (")
    assert line.endswith(
        "; the GPU memory of training and evaluation is unknown (no nvidia-smi on this machine), so no such job would be "
        "refused before it runs out; fix: run this on the machine with the GPUs, where nvidia-smi lists them"
    )
    profile = write_profile(tmp_path / "profile", {"executor": "slurm", "set-resources": {"train": {"gpu_memory_gib": 80}}})
    (line,) = lines_of(check_gpu_memory(qwen3_grid(tmp_path), profile))
    assert line.endswith(
        f"; the GPU memory of evaluation is unknown (profile {profile}: gpu_memory_gib), so no such job would be refused "
        f"before it runs out; fix: declare the GPUs' memory in {profile / 'config.yaml'}: set-resources: gpu_memory_gib "
        "(GiB) for train, evaluate and evaluate_base"
    )


# --- the models ------------------------------------------------------------------------------


def save_model(folder: Path, chat: bool = True) -> Path:
    """A tiny Qwen3 model folder, as ``save_pretrained`` writes one: config, tokenizer, weights."""
    from matrixrl.config import TinyScale
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    if chat:
        tokenizer.chat_template = CHAT
    build_tiny_model(TinyScale(kind="tiny"), tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def hf_scale(path, **fields):
    from matrixrl.config import HfScale

    return HfScale(kind="hf", path=str(path), device="cpu", **fields)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache of this test's own."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_model_folder_loads_offline(tmp_path):
    from matrixrl.doctor import check_model
    from matrixrl.retention import format_bytes

    folder = save_model(tmp_path / "mine")
    weights = format_bytes((folder / "model.safetensors").stat().st_size)
    assert lines_of(check_model("mine", hf_scale(folder))) == [
        f"✓ model mine: {folder}: qwen3, 0.3M parameters, tokenizer with a chat template, weights {weights}"
    ]


def test_a_missing_folder_or_an_uncached_hub_id_fails(tmp_path, hub_cache, monkeypatch):
    """A folder that went after the experiments file was read (it checks its folders), and a hub id
    on a machine with network (HF_HUB_OFFLINE unset: the fix downloads here)."""
    from matrixrl.doctor import check_model

    assert lines_of(check_model("mine", hf_scale(tmp_path / "gone"))) == [
        f"✗ model mine: no folder {tmp_path / 'gone'}; fix: fix scales.mine.path, or restore the folder"
    ]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert lines_of(check_model("qwen", hf_scale("Qwen/Qwen3-0.6B"))) == [
        "✗ model qwen: Qwen/Qwen3-0.6B is not in the local Hugging Face cache, and jobs run offline (HF_HUB_OFFLINE=1); "
        "fix: hf download Qwen/Qwen3-0.6B, or point scales.qwen.path at a model folder"
    ]
    (revised,) = check_model("qwen", hf_scale("Qwen/Qwen3-0.6B", revision="v1"))
    assert revised.fix.startswith("hf download Qwen/Qwen3-0.6B --revision v1,")


def cache_files(hub_cache: Path, repo: str, files: dict[str, str]) -> Path:
    """``files`` (name → text) as the hub cache holds a download of ``repo`` cut short: refs/main
    names a snapshot, whose files link to blobs."""
    folder = hub_cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abcd")
    (folder / "blobs").mkdir()
    for n, (name, text) in enumerate(files.items()):
        (folder / "blobs" / f"blob{n}").write_text(text)
        (snapshot / name).symlink_to(f"../../blobs/blob{n}")
    return snapshot


OFFLINE_FIX = (
    "on a machine with network (a login node): hf download nobody/not-a-model --cache-dir {cache} (a folder both "
    "machines see), or hf download nobody/not-a-model --local-dir DIR, then copy DIR here and set scales.qwen3-4b.path: DIR"
)


def test_offline_a_hub_model_not_cached_is_one_line_with_the_login_node_fix(tmp_path, monkeypatch):
    """On a GPU node without network (HF_HUB_OFFLINE=1, an empty HF_HOME): the whole model is missing,
    and the fix downloads it on a machine with network into the cache this node reads, or into a
    folder to copy here. Run as a user would, in a process of its own."""
    home = tmp_path / "hf-home"
    home.mkdir()
    config = tmp_path / "paper.yaml"
    config.write_text(PAPER.read_text())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HF_")}, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO), "PATH": str(tmp_path / "no-smi") + os.pathsep + os.path.dirname(sys.executable),
    }  # fmt: skip
    code = (
        "import sys; from matrixrl.config import load_config; from matrixrl.doctor import check_models, check_gpu_memory;"
        "c = load_config(sys.argv[1], sets=['scales.qwen3-4b.path=nobody/not-a-model'], only=['scale=qwen3-4b']);"
        "print('\\n'.join(check.line() for check in [*check_models(c, None), *check_gpu_memory(c, None)]))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    cache = home / "hub"
    assert proc.stdout.splitlines() == [
        f"✗ model qwen3-4b: nobody/not-a-model is not in the local Hugging Face cache ({cache}), and this machine is "
        f"offline (HF_HUB_OFFLINE=1): no config, tokenizer or weights; fix: {OFFLINE_FIX.format(cache=cache)}",
        "✗ GPU memory: qwen3-4b: unknown: no config.json of nobody/not-a-model on this machine; fix: on a machine with "
        f"network (a login node): hf download nobody/not-a-model config.json --cache-dir {cache} (a folder both machines see)",
    ]
    assert os.listdir(home) == []  # nothing downloaded, nothing written


def test_offline_each_missing_piece_of_a_cached_model_is_a_line(tmp_path, hub_cache):
    """Only config.json downloaded (enough for plan's memory estimate): the tokenizer and the weights
    are missing, one line each; the GPU memory check has its estimate."""
    from matrixrl.doctor import check_model

    cache_files(hub_cache, "nobody/not-a-model", {"config.json": json.dumps(QWEN3["qwen3-4b"])})
    scale = hf_scale("nobody/not-a-model")
    fix = OFFLINE_FIX.format(cache=hub_cache)
    assert lines_of(check_model("qwen3-4b", scale)) == [
        "✗ model qwen3-4b: nobody/not-a-model (Hugging Face cache): no tokenizer (tokenizer.json, tokenizer.model, "
        f"vocab.json, vocab.txt or spiece.model); fix: {fix}",
        "✗ model qwen3-4b: nobody/not-a-model (Hugging Face cache): no weights (model.safetensors or pytorch_model.bin, "
        f"whole or sharded); fix: {fix}",
    ]


def test_offline_a_folder_lacking_its_files_has_a_line_per_piece(tmp_path):
    from matrixrl.doctor import check_model

    folder = tmp_path / "copied"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"0" * 10)  # copied: the weights alone
    offline = " (without network here: hf download ID --local-dir DIR on a login node, then copy DIR's files in)"
    assert lines_of(check_model("mine", hf_scale(folder))) == [
        f"✗ model mine: {folder}: no config.json; fix: put the model's config.json in {folder}{offline}",
        f"✗ model mine: {folder}: no tokenizer (tokenizer.json, tokenizer.model, vocab.json, vocab.txt or spiece.model); "
        f"fix: put the model's tokenizer files in {folder}{offline}",
    ]


def test_a_hub_id_in_the_cache_loads_and_a_cut_download_fails(tmp_path, hub_cache, monkeypatch):
    """The cache's layout: refs/main names a snapshot, whose files link to blobs."""
    from matrixrl.doctor import check_model
    from matrixrl.retention import format_bytes

    repo = hub_cache / "models--acme--tiny-chat"
    snapshot = repo / "snapshots" / "0123abcd"
    save_model(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "blobs").mkdir()
    weights = snapshot / "model.safetensors"
    size = weights.stat().st_size
    weights.rename(repo / "blobs" / "f00d")
    weights.symlink_to("../../blobs/f00d")
    assert lines_of(check_model("acme", hf_scale("acme/tiny-chat"))) == [
        f"✓ model acme: acme/tiny-chat (Hugging Face cache): qwen3, 0.3M parameters, tokenizer with a chat template, "
        f"weights {format_bytes(size)}"
    ]
    (repo / "blobs" / "f00d").unlink()  # the download stopped before the weights' blob
    monkeypatch.delenv("HF_HUB_OFFLINE")  # a machine with network: download it here
    assert lines_of(check_model("acme", hf_scale("acme/tiny-chat"))) == [
        "✗ model acme: acme/tiny-chat (Hugging Face cache): no weights (model.safetensors or pytorch_model.bin, whole or "
        "sharded); fix: hf download acme/tiny-chat, or point scales.acme.path at a model folder"
    ]


def test_a_folder_without_weights_tokenizer_or_chat_template_fails(tmp_path, monkeypatch):
    from matrixrl.doctor import check_model

    monkeypatch.delenv("HF_HUB_OFFLINE")  # a machine with network: the fixes name no login node
    folder = save_model(tmp_path / "mine")
    (folder / "model.safetensors").unlink()
    assert lines_of(check_model("mine", hf_scale(folder))) == [
        f"✗ model mine: {folder}: no weights (model.safetensors or pytorch_model.bin, whole or sharded); "
        f"fix: put the model's weights in {folder}"
    ]
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"0" * 10)
    assert [check.found for check in check_model("mine", hf_scale(folder))] == [
        f"{folder}: 1 of the weight files its index names missing (model-00002-of-00002.safetensors)"
    ]
    plain = save_model(tmp_path / "plain", chat=False)
    assert lines_of(check_model("plain", hf_scale(plain))) == [
        f"✗ model plain: {plain}: prompt_style chat needs a chat template, and its tokenizer has none; fix: use an "
        "instruct model, or set scales.plain.prompt_style: compact"
    ]
    assert [check.ok for check in check_model("plain", hf_scale(plain, prompt_style="compact"))] == [True]
    (plain / "config.json").write_text("{")
    (broken,) = check_model("plain", hf_scale(plain, prompt_style="compact"))
    assert not broken.ok and broken.found.startswith(f"{plain}: its config does not load ("), broken.found
    assert broken.fix == f"put the model's config.json in {plain}"  # the tokenizer, failing with it, is not a line of its own
    (plain / "tokenizer.json").rename(plain / "moved.json")  # a tokenizer whose vocabulary file is gone
    (plain / "config.json").write_text(json.dumps(QWEN3["qwen3-4b"]))
    (tokenizer,) = check_model("plain", hf_scale(plain, prompt_style="compact"))
    assert tokenizer.line() == (
        f"✗ model plain: {plain}: no tokenizer (tokenizer.json, tokenizer.model, vocab.json, vocab.txt or spiece.model); "
        f"fix: put the model's tokenizer files in {plain}"
    )  # transformers makes an empty tokenizer of a folder without its files


def test_every_scale_a_run_loads_is_checked(tmp_path):
    """The grid's scales, and the memory's models even where --only leaves their scale out."""
    from matrixrl.config import load_config
    from matrixrl.doctor import check_models, used_scales

    config = qwen3_grid(tmp_path, only=("scale=qwen3-0.6b,qwen3-4b",))
    assert used_scales(config) == ["qwen3-0.6b", "qwen3-4b"]
    names = [check.name for check in check_models(config, None)]  # qwen3-4b's folder: 2 lines, no tokenizer nor weights
    assert names == ["model qwen3-0.6b", "model qwen3-4b", "model qwen3-4b"]
    memcollab = load_config(REPO / "examples" / "memcollab.yaml", only=["scale=qwen3-0.6b"])
    assert (memcollab.grid.scale, used_scales(memcollab)) == (["qwen3-0.6b"], ["qwen3-0.6b", "qwen3-4b"])


# --- the sandbox ----------------------------------------------------------------------------


def test_the_sandbox_runs_a_program_and_names_its_isolation(experiment):
    from matrixrl import sandbox
    from matrixrl.config import load_config
    from matrixrl.doctor import check_sandbox

    mode = sandbox.isolation()[0]
    (check,) = check_sandbox(load_config(experiment), None)
    assert check.ok == strong_sandbox() and check.found.startswith(f"{mode}: "), check.line()
    assert re.search(r"rlimits, the audit hook; a test program passed in \d+\.\d\d s", check.found)
    if mode == "view":  # the walls in force, by name
        who = "an unprivileged uid without capabilities" if os.geteuid() == 0 else "no capabilities (a user namespace)"
        assert re.fullmatch(
            f"view: a filesystem of its own \\(the standard library read-only, a {sandbox.SCRATCH_MB} MiB / "
            f"{sandbox.SCRATCH_FILES}-file scratch\\), mount, network and PID namespaces, {re.escape(who)}, "
            r"rlimits, the audit hook; a test program passed in \d+\.\d\d s", check.found,
        ), check.found
    assert lines_of(check_sandbox(load_config(experiment, only=["task=arith"]), None)) == [
        "✓ sandbox: not used: the grid has no code task"
    ]


@pytest.fixture
def weak_sandbox(monkeypatch):
    """The sandbox as on a machine without namespaces or a uid drop (its workers ended after)."""
    from matrixrl import sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: ("none", ()))
    yield
    sandbox._workers().close("none", ())


def test_a_sandbox_without_namespaces_fails(experiment, weak_sandbox):
    from matrixrl.config import load_config
    from matrixrl.doctor import check_sandbox

    (check,) = check_sandbox(load_config(experiment), None)
    assert re.fullmatch(
        r"none: rlimits, the audit hook; a test program passed in \d+\.\d\d s, but no filesystem view: answers can "
        r"read every file their uid may \(the task's data, their references\) and write where it may, unbounded; code "
        r"tasks refuse to score unless their without_view is warn and no namespaces( and no uid drop: programs run as "
        r"root)?", check.found,
    ), check.found
    assert not check.ok and check.fix.startswith("allow mount namespaces: in a container, let it unshare")
    assert check.found.endswith("programs run as root") == (os.geteuid() == 0)


def test_a_sandbox_that_cannot_run_a_program_fails(experiment, monkeypatch):
    from matrixrl import sandbox
    from matrixrl.config import load_config
    from matrixrl.doctor import check_sandbox

    monkeypatch.setattr(sandbox, "run", lambda *a, **k: sandbox.Verdict(False, "crashed", "exit status -9"))
    (check,) = check_sandbox(load_config(experiment), None)
    assert check.line() == (
        f"✗ sandbox: {sandbox.isolation()[0]}: a test program did not pass (crashed: exit status -9); fix: the sandbox "
        "cannot run programs here, so every code answer would score as failed; docs/sandbox.md says what it needs"
    )


# --- SLURM -----------------------------------------------------------------------------------


def write_profile(folder: Path, settings: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(settings))
    return folder


def fake_tools(folder: Path, **scripts: str) -> None:
    """Shell scripts on PATH in place of SLURM's commands (their body after the #! line)."""
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)


SLURM_PROFILE = {"executor": "slurm", "default-resources": {"slurm_partition": "cpu"},
                 "set-resources": {"train": {"slurm_partition": "gpu"}, "evaluate": {"slurm_partition": "gpu"}}}  # fmt: skip


def test_slurm_is_checked_only_under_a_slurm_profile(experiment, tmp_path):
    from matrixrl.config import load_config
    from matrixrl.doctor import check_slurm

    config = load_config(experiment)
    assert lines_of(check_slurm(config, None)) == ["✓ SLURM: not used: jobs run on this machine (no --profile)"]
    local = write_profile(tmp_path / "local", {"executor": "local", "jobs": 2})
    assert lines_of(check_slurm(config, local)) == [f"✓ SLURM: not used: jobs run on this machine (profile {local} runs them locally)"]


@pytest.fixture
def slurm_plugin(monkeypatch):
    """Snakemake's SLURM executor plugin counted as installed, whether or not it is: the checks
    after it (tools, controller, partitions) only look for it, and the README's install (no
    `slurm` extra) must run these tests too."""
    find_spec = importlib.util.find_spec
    fake = importlib.machinery.ModuleSpec("snakemake_executor_plugin_slurm", None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: fake if name == fake.name else find_spec(name, *a))


def test_a_slurm_profile_without_slurm_here_fails(experiment, tmp_path, monkeypatch, slurm_plugin):
    from matrixrl.config import load_config
    from matrixrl.doctor import check_slurm

    config, profile = load_config(experiment), write_profile(tmp_path / "slurm", SLURM_PROFILE)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert lines_of(check_slurm(config, profile)) == [
        f"✗ SLURM: profile {profile} submits to SLURM, and there is no scontrol and sinfo on PATH; fix: run matrixrl on "
        "a login node of the cluster (or load its SLURM module, e.g. module load slurm)"
    ]
    monkeypatch.undo()  # the plugin as it really is, then surely missing
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "slurm" in name else find_spec(name, *a))
    assert lines_of(check_slurm(config, profile)) == [
        f"✗ SLURM: profile {profile} submits to SLURM, and Snakemake's SLURM executor plugin is not installed; "
        "fix: pip install 'matrixrl[slurm]'"
    ]


def test_a_slurm_controller_that_does_not_answer_fails(experiment, tmp_path, monkeypatch, slurm_plugin):
    from matrixrl import doctor
    from matrixrl.config import load_config

    config, profile = load_config(experiment), write_profile(tmp_path / "slurm", SLURM_PROFILE)
    tools = tmp_path / "slurm-bin"
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    fake_tools(
        tools, sinfo="exit 1",
        scontrol="echo 'slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
    )  # fmt: skip
    fix = "check that slurmctld runs and that SLURM_CONF (or /etc/slurm/slurm.conf) names it; ask the cluster's admins"
    assert lines_of(doctor.check_slurm(config, profile)) == [
        "✗ SLURM: the SLURM controller does not answer (scontrol ping: slurm_load_ctl_conf error: Unable to contact "
        f"slurm controller (connect failure)); fix: {fix}"
    ]
    fake_tools(tools, scontrol="sleep 5")
    monkeypatch.setattr(doctor, "SLURM_TIMEOUT_S", 0.5)
    assert lines_of(doctor.check_slurm(config, profile)) == [
        f"✗ SLURM: the SLURM controller does not answer (scontrol ping: no answer in 0.5 s); fix: {fix}"
    ]


def test_a_profile_partition_the_cluster_lacks_fails(experiment, tmp_path, monkeypatch, slurm_plugin):
    from matrixrl.config import load_config
    from matrixrl.doctor import check_slurm

    config, profile = load_config(experiment), write_profile(tmp_path / "slurm", SLURM_PROFILE)
    tools = tmp_path / "slurm-bin"
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    fake_tools(tools, scontrol="echo 'Slurmctld(primary) at head is UP'", sinfo="printf 'cpu\\ndebug\\ncpu\\n'")
    assert lines_of(check_slurm(config, profile)) == [
        "✗ SLURM: partition 'gpu' (the profile's for evaluate, train) is not one of the cluster's: cpu, debug; fix: "
        f"set slurm_partition in {profile / 'config.yaml'} to one of them"
    ]
    fake_tools(tools, sinfo="printf 'cpu\\ngpu\\n'")
    assert lines_of(check_slurm(config, profile)) == [
        "✓ SLURM: the controller answers (scontrol ping); the profile's partitions: cpu, gpu"
    ]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.xdist_group("slurm-cluster")  # one worker runs every SLURM test (tests/conftest.py)
@pytest.mark.extra("slurm")
def test_a_real_slurm_cluster_passes(experiment, tmp_path):
    from slurm_cluster import slurm_cluster

    from matrixrl.config import load_config
    from matrixrl.doctor import check_slurm

    with slurm_cluster(tmp_path / "slurm") as cluster:
        profile = write_profile(tmp_path / "profile", {"executor": "slurm", "default-resources": {"slurm_partition": cluster.partition}})
        assert lines_of(check_slurm(load_config(experiment), profile)) == [
            f"✓ SLURM: the controller answers (scontrol ping); the profile's partitions: {cluster.partition}"
        ]


# --- disk and the results folder -------------------------------------------------------------


def test_a_disk_short_of_the_checkpoints_peak_fails(experiment, monkeypatch):
    from matrixrl.config import load_config
    from matrixrl.disk import disk_at_peak
    from matrixrl.doctor import check_disk
    from matrixrl.planning import jobs_at_once
    from matrixrl.retention import format_bytes

    config = load_config(experiment)
    peak = format_bytes(disk_at_peak(config, jobs_at_once(None)).peak)
    usage = type(shutil.disk_usage(experiment.parent))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 1000, 1000))
    assert lines_of(check_disk(config, None)) == [
        f"✗ disk: 1 kB free at {experiment.parent}, but the checkpoints need ~{peak} more at the run's peak; fix: "
        "free some space there, point results_dir at a larger disk, or keep fewer checkpoints (train.keep_checkpoints: "
        "key; `matrixrl plan` shows the estimate)"
    ]


def test_checkpoints_of_unknown_size_fail_the_disk_check(tmp_path, hub_cache):
    from matrixrl.config import load_config
    from matrixrl.doctor import check_disk

    config = load_config(PAPER, sets=[f"results_dir={tmp_path / 'results'}"], only=["scale=qwen3-0.6b,qwen3-4b"])
    (check,) = check_disk(config, None)
    assert not check.ok and check.found.endswith(
        "; the checkpoints need ~0 B more at the run's peak, not counting scales qwen3-0.6b, qwen3-4b, whose model "
        "config is not here"
    )
    assert check.fix == "download their models (the model lines say how), then run doctor again"


RESULTS_CHECK = (
    "import sys\nfrom matrixrl.config import load_config\nfrom matrixrl.doctor import check_results_folder\n"
    "print(check_results_folder(load_config(sys.argv[1], sets=sys.argv[2:]), None)[0].line())\n"
)


def results_line(experiment: Path, *sets: str) -> str:
    """The results-folder check in a process without root's right to write anywhere (setpriv)."""
    unprivileged = ()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root writes anywhere; dropping that needs setpriv (util-linux)")
        unprivileged = (
            "setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search", "--",
        )  # fmt: skip
    proc = subprocess.run(
        [*unprivileged, sys.executable, "-c", RESULTS_CHECK, str(experiment), *sets],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_read_only_results_folder_fails_and_nothing_is_left_behind(experiment):
    results = experiment.parent / "results"
    results.mkdir()
    (results / "kept.txt").write_text("x")
    fix = "or point results_dir at a folder that is (--set results_dir=PATH)"
    assert results_line(experiment) == f"✓ results folder: {results} is writable"
    results.chmod(0o555)
    try:
        assert results_line(experiment) == (
            f"✗ results folder: cannot write in {results}: permission denied; fix: make {results} writable for this user, {fix}"
        )
        assert results_line(experiment, "results_dir=results/new/deeper") == (
            f"✗ results folder: cannot write in {results}: permission denied; fix: make {results} writable for this user, {fix}"
        )
    finally:
        results.chmod(0o755)
    assert os.listdir(results) == ["kept.txt"]


def test_a_file_on_the_results_folders_path_is_named_not_made_writable(experiment):
    """A Config made in code (load_config refuses it) whose results_dir is under a file: the fix
    is another folder, not write permission on the file."""
    from matrixrl.config import load_config
    from matrixrl.doctor import check_results_folder

    blocker = experiment.parent / "afile"
    blocker.write_text("a file")
    config = load_config(experiment).model_copy(update={"results_dir": str(blocker / "sub")})
    assert check_results_folder(config, None)[0].line() == (
        f"✗ results folder: cannot write in {blocker}: a part of the path is a file, not a folder; "
        f"fix: {blocker} is a file, not a folder; point results_dir at a folder (--set results_dir=PATH)"
    )
