"""What a run of the grid needs, checked one line each, ✓ or ✗ with the fix (``matrixrl doctor``).

Nothing starts CUDA, loads weights or downloads. docs/real-models.md, "Before a GPU run".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from matrixrl.config import Config

CUDA_INDEX = "https://download.pytorch.org/whl/cu128"
"""The index of torch's CUDA builds that the torch fix names (pytorch.org lists the others)."""

SLURM_TIMEOUT_S = 10
"""How long ``scontrol ping`` and ``sinfo`` may take before SLURM counts as unreachable."""

SANDBOX_PROBE = (
    "import os, sys\nuid, parent = os.getuid(), os.getppid()\n"
    "host = [p for p in ('/etc', '/proc/self', '/home', '/root') if os.path.exists(p)]\n"
)
"""The program the sandbox check runs; its tests assert what the isolation in use promises."""

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
"""The weight files ``from_pretrained`` loads, each whole or sharded (``NAME.index.json``)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""Files a tokenizer reads its vocabulary from, one of which a model's folder holds
(``tokenizer_config.json`` alone holds none)."""


@dataclass(frozen=True)
class Check:
    """One line of ``matrixrl doctor``: ``✓ name: found`` or ``✗ name: found; fix: fix``."""

    name: str
    ok: bool
    found: str
    fix: str = ""

    def line(self) -> str:
        text = f"{'✓' if self.ok else '✗'} {self.name}: {self.found}"
        return f"{text}; fix: {self.fix}" if not self.ok and self.fix else text


def passed(name: str, found: str) -> Check:
    return Check(name, True, found)


def failed(name: str, found: str, fix: str) -> Check:
    return Check(name, False, found, fix)


# --- what the grid uses ---------------------------------------------------------------------


def used_scales(config: Config) -> list[str]:
    """The scales whose models a run of the grid loads: the grid's, and the memory's models
    (weak, strong, distiller, labeller) when a memory mode is in use."""
    names = dict.fromkeys(config.grid.scale)
    memory = config.memory
    modes = {*config.grid.memory, *([memory.train] if memory is not None and memory.train else [])}
    if memory is not None and modes - {"none"}:
        names.update(dict.fromkeys((memory.weak, memory.strong, memory.distiller_scale, memory.labeller_scale)))
    return list(names)


def gpu_scales(config: Config) -> list[str]:
    """The scales the grid uses that run on a GPU (``kind: hf`` without ``device: cpu``)."""
    from matrixrl.models.hf import needs_gpu

    return [name for name in used_scales(config) if needs_gpu(config.scales[name])]


def _scales(names: list[str]) -> str:
    return f"scale{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _run_on_gpu(names: list[str]) -> str:
    return f"{_scales(names)} run{'' if len(names) > 1 else 's'} on a GPU"


def _on_cpu(names: list[str]) -> str:
    """The other way out of a GPU fix: run those scales on CPU."""
    if len(names) == 1:
        return f"set scales.{names[0]}.device: cpu to run it on CPU"
    return f"set device: cpu on {_scales(names)} to run them on CPU"


# --- torch and the GPUs ---------------------------------------------------------------------


def driver_cuda() -> str | None:
    """The newest CUDA version the NVIDIA driver runs (nvidia-smi's header), None where unknown."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*(\d+\.\d+)", proc.stdout)
    return found[1] if found else None


def _torch_sees_gpu(torch) -> bool:
    """Whether torch finds a GPU, asked through NVML so that CUDA does not start in this process."""
    before = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if before is None:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = before


def check_torch(config: Config, profile: Path | None) -> list[Check]:
    """torch's version and CUDA build: any build passes a grid of CPU scales; for a GPU scale it
    must be a CUDA build the driver runs (its CUDA major version at most the driver's, from
    nvidia-smi) that, where nvidia-smi lists GPUs here, sees them."""
    import torch

    from matrixrl.models.devices import visible_gpus

    version, cuda = torch.__version__, torch.version.cuda
    release = version.split("+")[0]
    gpu = gpu_scales(config)
    if not gpu:
        build = "a CPU build" if cuda is None else f"a CUDA {cuda} build"
        return [passed("torch", f"{version}, {build}: every scale of the grid runs on CPU")]
    if cuda is None:
        return [failed(
            "torch", f"{version} has no CUDA build, and {_run_on_gpu(gpu)}",
            f"pip install torch=={release} --index-url {CUDA_INDEX} (a CUDA build), or {_on_cpu(gpu)}",
        )]  # fmt: skip
    driver = driver_cuda()
    if driver is not None and int(cuda.split(".")[0]) > int(driver.split(".")[0]):
        return [failed(
            "torch", f"{version} is built for CUDA {cuda}, newer than the NVIDIA driver's CUDA {driver}",
            f"install a torch {release} built for CUDA {driver.split('.')[0]}.x (pytorch.org lists them), "
            "or update the NVIDIA driver",
        )]  # fmt: skip
    gpus = visible_gpus()
    if gpus and not _torch_sees_gpu(torch):
        return [failed(
            "torch", f"{version} (CUDA {cuda}) sees no GPU, while nvidia-smi lists {len(gpus)}",
            "check the NVIDIA driver and that this environment's torch is the CUDA build you installed "
            "(python -c 'import torch; print(torch.cuda.is_available())')",
        )]  # fmt: skip
    with_driver = f", the driver runs CUDA {driver}" if driver is not None else ""
    return [passed("torch", f"{version}, a CUDA {cuda} build{with_driver}")]


def check_libraries(config: Config, profile: Path | None) -> list[Check]:
    """Each library of ``models.versions.REQUIRED`` within its requirement: a preinstalled image or
    a ``--no-deps`` install can hold a version pip would refuse, and an older transformers drops
    the KV cache without a word. One ✗ line per library outside its range."""
    from matrixrl.models.versions import REQUIRED, fix_for, installed_version, outside

    name = "libraries"
    problems = {library: outside(library) for library in REQUIRED}
    bad = [failed(name, problem, fix_for(library)) for library, problem in problems.items() if problem]
    bad += [failed(name, problem, fix) for problem, fix in missing_packages(config)]
    found = ", ".join(f"{library} {installed_version(library)}" for library in REQUIRED)
    return bad or [passed(name, f"{found}: within matrixrl's requirements")]


def _hub_tasks(config: Config) -> list[str]:
    """The grid's tasks read from the hub (a task's ``hub:``): they need the ``hub`` extra."""
    return [task for task in config.grid.task if getattr(config.tasks[task], "hub", None)]


def missing_packages(config: Config) -> list[tuple[str, str]]:
    """(what is missing, the fix) for each package a run of the grid imports that is not installed:
    matrixrl's own dependencies as its metadata lists them (``REQUIRED``'s have their own lines),
    and the ``hub`` extra's where a task reads the hub."""
    import importlib.metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from matrixrl.models.versions import REQUIRED, installed_version

    try:
        declared = importlib.metadata.requires("matrixrl") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return []
    hub = _hub_tasks(config)
    found = []
    for line in declared:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is None:
            extra, why = None, "matrixrl requires it"
        elif hub and marker.evaluate({"extra": "hub"}) and not marker.evaluate({"extra": ""}):
            extra, why = "hub", f"task{'s' if len(hub) > 1 else ''} {', '.join(hub)} read{'' if len(hub) > 1 else 's'} the hub"
        else:
            continue
        if canonicalize_name(requirement.name) in {canonicalize_name(r) for r in REQUIRED}:
            continue
        if installed_version(requirement.name) is not None:
            continue
        spec = f"{requirement.name}{requirement.specifier}"
        install = f"pip install 'matrixrl[{extra}]'" if extra else f"pip install '{spec}'"
        if offline_here():
            install += (
                f" (without network here: pip download '{spec}' -d wheels on a login node, with this machine's "
                f"Python, then pip install --no-index --find-links wheels '{spec}' here)"
            )
        what = f"the {extra} extra's {requirement.name}" if extra else requirement.name
        found.append((f"{what} is not installed ({spec}), and {why}", install))
    return found


def check_gpus(config: Config, profile: Path | None) -> list[Check]:
    """The GPUs jobs started here get (nvidia-smi, the smallest visible one's memory): needed
    when the grid has a GPU scale and its jobs run on this machine."""
    from matrixrl.gpu_memory import gib
    from matrixrl.gpu_memory.budget import local_gpu_memory
    from matrixrl.snake.profiles import cluster_executor

    executor = cluster_executor(profile)
    if executor is not None:
        return [passed(
            "GPUs", f"not checked here: profile {profile} runs the jobs on the cluster's nodes (executor: {executor}); "
            "GPU memory below is what it declares",
        )]  # fmt: skip
    memory, source = local_gpu_memory()
    here = f"{gib(memory)} GiB per job ({source})" if memory is not None else source
    gpu = gpu_scales(config)
    if not gpu:
        return [passed("GPUs", f"none needed: the grid has no GPU scale; here: {here}")]
    if memory is None:
        return [failed(
            "GPUs", f"none here: {here}, but {_run_on_gpu(gpu)}",
            f"run on a machine whose GPUs nvidia-smi lists (and CUDA_VISIBLE_DEVICES does not hide), or {_on_cpu(gpu)}",
        )]  # fmt: skip
    return [passed("GPUs", here)]


# --- the models -----------------------------------------------------------------------------


def check_models(config: Config, profile: Path | None) -> list[Check]:
    """Every hf scale's model on this machine and loadable offline: its folder, or the hub id in
    the local Hugging Face cache; config and tokenizer load (a chat template for chat prompts);
    its weight files are there (not loaded). One line per scale, or per piece it lacks."""
    hf = [name for name in used_scales(config) if config.scales[name].kind == "hf"]
    if not hf:
        return [passed("models", "no hf scale in the grid: its tiny models are built by the run")]
    return [check for name in hf for check in check_model(name, config.scales[name])]


def offline_here() -> bool:
    """Whether this machine is marked as having no hub (``HF_HUB_OFFLINE`` set true, as a cluster's
    compute nodes set it): then a fix that downloads names a machine with network. Read from the
    environment as it is now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_cache() -> str:
    """The Hugging Face hub cache this machine reads (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    import huggingface_hub.constants

    return str(huggingface_hub.constants.HF_HUB_CACHE)


def cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The folder of ``repo``'s snapshot in the local hub cache, found by any file of a model
    that it holds (config, tokenizer, weights); None when the cache holds none of them."""
    from huggingface_hub import try_to_load_from_cache

    names = ("config.json", "tokenizer_config.json", *TOKENIZER_FILES, *WEIGHTS, *(f"{w}.index.json" for w in WEIGHTS))
    for filename in names:
        try:
            cached = try_to_load_from_cache(repo, filename, revision=revision)
        except ValueError:  # not a valid hub id
            return None
        if isinstance(cached, str):
            return Path(cached).parent
    return None


def hub_fix(name: str, scale) -> str:
    """How to bring a hub model into the cache jobs read: ``hf download`` here, or, on an offline
    machine, on one with network into the same cache (a shared filesystem), or into a folder to
    copy here."""
    revision = f" --revision {scale.revision}" if scale.revision else ""
    if not offline_here():
        return f"hf download {scale.path}{revision}, or point scales.{name}.path at a model folder"
    return (
        f"on a machine with network (a login node): hf download {scale.path}{revision} --cache-dir {hub_cache()} "
        f"(a folder both machines see), or hf download {scale.path}{revision} --local-dir DIR, then copy DIR here "
        f"and set scales.{name}.path: DIR"
    )


def folder_fix(folder: Path, what: str) -> str:
    """How to complete a model folder that lacks ``what``."""
    fix = f"put the model's {what} in {folder}"
    if offline_here():
        fix += " (without network here: hf download ID --local-dir DIR on a login node, then copy DIR's files in)"
    return fix


def check_model(name: str, scale) -> list[Check]:
    """One hf scale's model (see :func:`check_models`): one ✓ line, or a ✗ line per piece it lacks
    (config.json, tokenizer, weights) and per piece that does not load."""
    what = f"model {name}"
    folder = Path(scale.path)
    hub = not folder.is_dir() and not folder.is_absolute()
    if not folder.is_dir():
        if not hub:
            return [failed(what, f"no folder {folder}", f"fix scales.{name}.path, or restore the folder")]
        snapshot = cached_snapshot(scale.path, scale.revision)
        if snapshot is None:
            if offline_here():
                found = (
                    f"{scale.path} is not in the local Hugging Face cache ({hub_cache()}), and this machine is offline "
                    "(HF_HUB_OFFLINE=1): no config, tokenizer or weights"
                )
            else:
                found = f"{scale.path} is not in the local Hugging Face cache, and jobs run offline (HF_HUB_OFFLINE=1)"
            return [failed(what, found, hub_fix(name, scale))]
        folder = snapshot
    where = f"{scale.path} (Hugging Face cache)" if hub else str(folder)

    def fix(piece: str) -> str:
        return hub_fix(name, scale) if hub else folder_fix(folder, piece)

    problems: list[Check] = []
    model_config, tokenizer, tokenizer_error = None, None, None
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a missing-file warning would land between the lines
    try:
        if not (folder / "config.json").is_file():
            problems.append(failed(what, f"{where}: no config.json", fix("config.json")))
        else:
            try:
                model_config = AutoConfig.from_pretrained(folder, local_files_only=True)
            except Exception as exc:  # noqa: BLE001: any failure to load is the finding
                problems.append(failed(what, f"{where}: its config does not load ({_first_line(exc)})", fix("config.json")))
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # noqa: BLE001
            tokenizer_error = _first_line(exc)
    finally:
        hf_logging.set_verbosity(verbosity)
    fields = model_config.to_dict() if model_config is not None else {}
    fields = fields.get("text_config", fields)  # a multimodal config nests the language model's
    vocab = fields.get("vocab_size")
    # transformers makes an empty tokenizer of a folder without its files
    empty = tokenizer is not None and isinstance(vocab, int) and len(tokenizer) < vocab // 2
    if not any((folder / f).is_file() for f in TOKENIZER_FILES) and (tokenizer is None or empty or vocab is None):
        problems.append(failed(what, f"{where}: no tokenizer ({_either(TOKENIZER_FILES)})", fix("tokenizer files")))
    elif tokenizer is None and not problems:  # a config that does not load fails the tokenizer too: said once
        problems.append(failed(what, f"{where}: its tokenizer does not load ({tokenizer_error})", fix("files")))
    elif empty:
        problems.append(failed(
            what, f"{where}: its tokenizer has {len(tokenizer)} tokens for the model's {vocab}: its files are missing",
            fix("tokenizer files"),
        ))  # fmt: skip
    elif scale.prompt_style == "chat" and not getattr(tokenizer, "chat_template", None):
        problems.append(failed(
            what, f"{where}: prompt_style chat needs a chat template, and its tokenizer has none",
            f"use an instruct model, or set scales.{name}.prompt_style: compact",
        ))  # fmt: skip
    size, missing = weight_files(folder)
    if size is None or missing:
        lacking = f"{len(missing)} of the weight files its index names missing ({', '.join(missing)})" if missing else (
            f"no weights ({' or '.join(WEIGHTS)}, whole or sharded)"
        )
        problems.append(failed(what, f"{where}: {lacking}", fix("weights")))
    if problems:
        return problems
    from matrixrl.disk import decoder_shape
    from matrixrl.retention import format_bytes

    shape = decoder_shape(fields)
    parameters = f", {_count(shape.parameters)} parameters" if shape is not None else ""
    chat = " with a chat template" if getattr(tokenizer, "chat_template", None) else ""
    return [passed(what, f"{where}: {model_config.model_type}{parameters}, tokenizer{chat}, weights {format_bytes(size)}")]


def _either(names: tuple[str, ...]) -> str:
    """``a, b or c``."""
    return f"{', '.join(names[:-1])} or {names[-1]}"


def weight_files(folder: Path) -> tuple[int | None, list[str]]:
    """The bytes of the weight files ``from_pretrained`` would load from ``folder`` (None: there
    are none), and the shards its index names that are missing (a download cut short)."""
    for name in WEIGHTS:
        index = folder / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError):  # a broken index loads nothing
                return None, []
            present = [folder / s for s in shards if (folder / s).is_file()]
            return sum(p.stat().st_size for p in present), [s for s in shards if not (folder / s).is_file()]
        if (folder / name).is_file():  # a hub cache's link to its blob: is_file follows it
            return (folder / name).stat().st_size, []
    return None, []


def _count(n: int) -> str:
    """A parameter count as people write it: 4.02B, 135.1M, 0.3M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- GPU memory -----------------------------------------------------------------------------


def check_gpu_memory(config: Config, profile: Path | None) -> list[Check]:
    """The largest training and evaluation job's estimate (matrixrl.gpu_memory) against the GPU
    each will get (the smallest visible one, or a profile's ``gpu_memory_gib``); a GPU whose
    memory is unknown fails too."""
    from matrixrl.gpu_memory import gib, gpu_budget
    from matrixrl.gpu_memory.budget import PROFILE_RESOURCE
    from matrixrl.gpu_memory.fits import largest_jobs, refused_jobs
    from matrixrl.models.hf import needs_gpu

    name = "GPU memory"
    if not any(needs_gpu(config.scales[scale]) for scale in config.grid.scale):
        return [passed(name, "nothing to estimate: the grid has no GPU scale")]
    largest, unknown = largest_jobs(config)
    checks = [
        failed(name, f"{scale}: unknown: no config.json of {path} on this machine", config_fix(path))
        for scale, path in unknown.items()
        if scale not in largest
    ]
    biggest = {}
    for job in ("training", "evaluation"):
        found = [held[job] for held in largest.values() if job in held]
        if found:
            biggest[job] = max(found, key=lambda estimate: estimate.total)
    if not biggest:
        return checks
    needs = ", ".join(f"{job} up to about {gib(e.total)} GiB ({e.cell}: {e.at})" for job, e in biggest.items())
    budget = gpu_budget(profile)
    blind = [job for job in biggest if budget.of(job) is None]
    if blind:
        fix = (
            f"declare the GPUs' memory in {profile / 'config.yaml'}: set-resources: {PROFILE_RESOURCE} (GiB) "
            "for train, evaluate and evaluate_base" if profile is not None
            else "run this on the machine with the GPUs, where nvidia-smi lists them"
        )  # fmt: skip
        checks.append(failed(
            name, f"{needs}; the GPU memory of {' and '.join(blind)} is unknown ({budget.source}), so no such job "
            "would be refused before it runs out", fix,
        ))  # fmt: skip
    refused = refused_jobs(config, budget)
    checks += [failed(name, problem, fix) for problem, fix in refused]
    if not checks:
        sizes = {gib(budget.of(job)) for job in biggest}
        gpu = f"the {sizes.pop()} GiB GPU" if len(sizes) == 1 else ", ".join(f"{job} {gib(budget.of(job))} GiB" for job in biggest)
        checks.append(passed(name, f"{needs}: within {gpu} ({budget.source})"))
    return checks


def config_fix(path: str) -> str:
    """How to bring a model's config.json, all the memory estimate reads, to this machine."""
    if not offline_here():
        return f"hf download {path} config.json"
    return (
        f"on a machine with network (a login node): hf download {path} config.json --cache-dir {hub_cache()} "
        "(a folder both machines see)"
    )


# --- the code sandbox -----------------------------------------------------------------------


def check_sandbox(config: Config, profile: Path | None) -> list[Check]:
    """The code sandbox's isolation (``sandbox.isolation()``), its walls named, and a program run
    in it, whose tests assert what that isolation promises: no file of the host in sight, an
    unprivileged uid, a PID namespace whose process 1 is its worker. Passes with the view
    (docs/sandbox.md); without it, says what is then unprotected."""
    from matrixrl import sandbox
    from matrixrl.gpu_memory.workload import CODE_KINDS
    from matrixrl.snake.profiles import cluster_executor

    name = "sandbox"
    if not any(config.tasks[task].kind in CODE_KINDS for task in config.grid.task):
        return [passed(name, "not used: the grid has no code task")]
    mode, prefix = sandbox.isolation()
    root = os.geteuid() == 0
    view = mode == "view"
    namespaces = view or "namespaces" in mode
    dropped = "uid" in mode or (view and root)
    tests = []
    if view:
        tests.append("assert not host, f'the host is in sight: {host}'")
    if dropped:
        tests.append("assert uid != 0, f'uid {uid}'")
    if namespaces:
        tests.append("assert parent in (0, 1), f'parent process {parent} is visible'")  # its worker is process 1
    verdict = sandbox.run(SANDBOX_PROBE, "\n".join(tests) + "\n", timeout_s=30, memory_mb=256)
    if not verdict.passed:
        return [failed(
            name, f"{mode}: a test program did not pass ({verdict.reason}: {verdict.detail or 'no detail'})",
            "the sandbox cannot run programs here, so every code answer would score as failed; docs/sandbox.md "
            "says what it needs",
        )]  # fmt: skip
    layers = []
    if view:
        layers.append(
            f"a filesystem of its own (the standard library read-only, a {sandbox.SCRATCH_MB} MiB / "
            f"{sandbox.SCRATCH_FILES}-file scratch), mount, network and PID namespaces"
        )
    elif namespaces:
        layers.append("network and PID namespaces")
    if dropped:
        kept = any("dac_read_search" in part for part in prefix)
        layers.append(
            "an unprivileged uid" + (" (keeping CAP_DAC_READ_SEARCH: Python lies where only root may enter)" if kept else "")
            + (" without capabilities" if view else "")
        )
    elif view:
        layers.append("no capabilities (a user namespace)")
    layers.append("rlimits, the audit hook")
    found = f"{mode}: {', '.join(layers)}; a test program passed in {verdict.seconds:.2f} s"
    if cluster_executor(profile) is not None:
        found += " (on this machine: the cluster's nodes run the jobs)"
    if view:
        return [passed(name, found)]
    missing = [
        "no filesystem view: answers can read every file their uid may (the task's data, their references) and "
        "write where it may, unbounded; code tasks refuse to score unless their without_view is warn"
    ]
    if not namespaces:
        missing.append("no namespaces")
    if not (dropped or not root):
        missing.append("no uid drop: programs run as root")
    fixes = [
        "install util-linux (unshare)" if shutil.which("unshare") is None
        else "allow mount namespaces: in a container, let it unshare (docker run --security-opt seccomp=unconfined, "
        "or --cap-add SYS_ADMIN); not as root, also unprivileged user namespaces (sysctl "
        "kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)"
    ]  # fmt: skip
    return [failed(name, f"{found}, but {' and '.join(missing)}", "; ".join(fixes))]


# --- SLURM ----------------------------------------------------------------------------------


def check_slurm(config: Config, profile: Path | None) -> list[Check]:
    """Under a profile whose executor is ``slurm``: its executor plugin installed, the controller
    answering (``scontrol ping``), and every partition the profile names one of the cluster's
    (``sinfo``), each within ``SLURM_TIMEOUT_S``."""
    import importlib.util

    from matrixrl.snake.profiles import cluster_executor, partitions

    name = "SLURM"
    executor = cluster_executor(profile)
    if executor is None:
        where = "no --profile" if profile is None else f"profile {profile} runs them locally"
        return [passed(name, f"not used: jobs run on this machine ({where})")]
    if executor != "slurm":
        return [passed(name, f"not used: profile {profile}'s executor is {executor}, which doctor does not check")]
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return [failed(
            name, f"profile {profile} submits to SLURM, and Snakemake's SLURM executor plugin is not installed",
            "pip install 'matrixrl[slurm]'",
        )]  # fmt: skip
    tools = {tool: shutil.which(tool) for tool in ("scontrol", "sinfo")}
    if None in tools.values():
        lacking = " and ".join(tool for tool, path in tools.items() if path is None)
        return [failed(
            name, f"profile {profile} submits to SLURM, and there is no {lacking} on PATH",
            "run matrixrl on a login node of the cluster (or load its SLURM module, e.g. module load slurm)",
        )]  # fmt: skip
    answer = _slurm([tools["scontrol"], "ping"])
    if answer is None or answer[0] != 0 or not re.search(r"\bis UP\b", answer[1]):
        said = f"no answer in {SLURM_TIMEOUT_S} s" if answer is None else (answer[1].splitlines() or ["nothing"])[0]
        return [failed(
            name, f"the SLURM controller does not answer (scontrol ping: {said})",
            "check that slurmctld runs and that SLURM_CONF (or /etc/slurm/slurm.conf) names it; ask the cluster's admins",
        )]  # fmt: skip
    listed = _slurm([tools["sinfo"], "--noheader", "--format=%R"])
    cluster = sorted(set(listed[1].split())) if listed is not None and listed[0] == 0 else []
    wanted = partitions(profile)
    missing = {partition: rules for partition, rules in wanted.items() if partition not in cluster}
    if missing:
        partition, rules = next(iter(missing.items()))
        return [failed(
            name, f"partition {partition!r} (the profile's for {', '.join(rules)}) is not one of the cluster's: "
            f"{', '.join(cluster) or 'none listed'}",
            f"set slurm_partition in {profile / 'config.yaml'} to one of them",
        )]  # fmt: skip
    named = f"; the profile's partitions: {', '.join(wanted)}" if wanted else ""
    return [passed(name, f"the controller answers (scontrol ping){named}")]


def _slurm(argv: list[str]) -> tuple[int, str] | None:
    """(exit status, stdout and stderr) of a SLURM command, None when it does not answer in time."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode, (proc.stdout + proc.stderr).strip()


# --- disk and the results folder ------------------------------------------------------------


def check_disk(config: Config, profile: Path | None) -> list[Check]:
    """Free space where the results folder is (or will be) against what its checkpoints add at
    the run's peak: ``plan``'s disk estimate less the checkpoints already on disk."""
    from matrixrl import grid as G
    from matrixrl import layout as L
    from matrixrl.disk import disk_at_peak
    from matrixrl.errors import existing_parent
    from matrixrl.planning import jobs_at_once
    from matrixrl.retention import format_bytes
    from matrixrl.train.checkpoints import folder_bytes

    results = Path(config.results_dir)
    where = existing_parent(results)
    estimate = disk_at_peak(config, jobs_at_once(profile))
    held = sum(folder_bytes(L.checkpoints_dir(results / L.cell_dir(run.id))) for run in G.runs(config))
    more = max(0, estimate.peak - held)
    free = shutil.disk_usage(where).free
    needs = f"the checkpoints need ~{format_bytes(more)} more at the run's peak"
    if estimate.unknown:  # an hf scale's checkpoint size needs its config.json
        return [failed(
            "disk", f"{format_bytes(free)} free at {where}; {needs}, not counting {_scales(list(estimate.unknown))}, "
            "whose model config is not here", "download their models (the model lines say how), then run doctor again",
        )]  # fmt: skip
    if free >= more:
        return [passed("disk", f"{format_bytes(free)} free at {where}; {needs}")]
    return [failed(
        "disk", f"{format_bytes(free)} free at {where}, but {needs}",
        "free some space there, point results_dir at a larger disk, or keep fewer checkpoints "
        "(train.keep_checkpoints: key; `matrixrl plan` shows the estimate)",
    )]  # fmt: skip


def check_results_folder(config: Config, profile: Path | None) -> list[Check]:
    """The results folder, or the nearest folder above it that exists, takes a file: a temporary
    one, removed at once."""
    from matrixrl.errors import existing_parent, os_error_reason

    name = "results folder"
    results = Path(config.results_dir)
    where = existing_parent(results)
    fix = f"make {where} writable for this user, or point results_dir at a folder that is (--set results_dir=PATH)"
    if where.exists() and not where.is_dir():  # a file on the way (load_config refuses one, a Config made in code may not)
        fix = f"{where} is a file, not a folder; point results_dir at a folder (--set results_dir=PATH)"
    try:
        handle, path = tempfile.mkstemp(prefix=".matrixrl-doctor-", dir=where)
    except OSError as exc:
        return [failed(name, f"cannot write in {where}: {os_error_reason(exc)}", fix)]
    os.close(handle)
    os.unlink(path)
    if where == results:
        return [passed(name, f"{results} is writable")]
    return [passed(name, f"{results} does not exist yet, and {where} lets the run create it")]


# --- all of them ----------------------------------------------------------------------------


CHECKS: tuple[Callable[[Config, Path | None], list[Check]], ...] = (
    check_torch,
    check_libraries,
    check_gpus,
    check_models,
    check_gpu_memory,
    check_sandbox,
    check_slurm,
    check_disk,
    check_results_folder,
)
"""Every check, in the order ``matrixrl doctor`` prints them."""


def diagnose(config: Config, profile: Path | None = None) -> Iterator[Check]:
    """Every check's results for ``config``'s grid under ``profile``, as each check ends.
    A profile that is no Snakemake profile raises ProfileError (one line) first."""
    from matrixrl.snake.profiles import check_profile

    if profile is not None:
        profile = check_profile(Path(profile))
    for check in CHECKS:
        yield from check(config, profile)


def summary(checks: list[Check]) -> str:
    """The last line: every check passes, and what to run next; or how many fail."""
    bad = sum(not check.ok for check in checks)
    if not bad:
        return f"All {len(checks)} checks pass: `matrixrl plan` shows the jobs, `matrixrl run` runs them."
    return f"{bad} of {len(checks)} checks fail."
