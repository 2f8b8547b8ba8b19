"""The disk a grid's checkpoints need at their peak, under ``train.keep_checkpoints``.

docs/configuration.md, "Checkpoint retention and the disk it needs".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from matrixrl import layout as L

KEY_AT_MOST = 5
"""The most checkpoints ``key`` keeps: peak, final (the resume point), a cliff's onset and its neighbours."""

_MASTER_BYTES = 4  # trained weights stay float32 whatever the compute dtype (matrixrl.models.hf)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's parameter count and its per-layer linear modules (name → (in, out) features),
    with the widths the GPU memory estimate needs (matrixrl.gpu_memory)."""

    parameters: int
    layers: int
    linears: dict[str, tuple[int, int]]
    hidden: int = 0
    heads: int = 0
    vocab: int = 0
    tied: bool = True  # the output layer is the embedding (one matrix)
    qk_norm: bool = False  # Qwen3's RMSNorms on each head's queries and keys

    def lora_parameters(self, rank: int, targets: Iterable[str]) -> int:
        """Parameters of one LoRA adapter on ``targets``: rank × (in + out) per module and layer."""
        return self.layers * sum(rank * (i + o) for name, (i, o) in self.linears.items() if name in set(targets))


def decoder_shape(config: dict) -> ModelShape | None:
    """The shape of a Llama/Qwen-family decoder from its ``config.json`` fields (None: not that family)."""
    try:
        h, inter, layers = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or h // heads)
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kind = config.get("model_type")
    linears = {
        "q_proj": (h, heads * head_dim),
        "k_proj": (h, kv * head_dim),
        "v_proj": (h, kv * head_dim),
        "o_proj": (heads * head_dim, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    per_layer = sum(i * o for i, o in linears.values()) + 2 * h  # + the two RMSNorms
    if kind == "qwen2":  # biases on q, k and v, always
        per_layer += (heads + 2 * kv) * head_dim
    elif config.get("attention_bias"):
        per_layer += (heads + 2 * kv) * head_dim + h
    if config.get("mlp_bias"):
        per_layer += 2 * inter + h
    if kind == "qwen3":
        per_layer += 2 * head_dim  # q_norm, k_norm
    tied = config.get("tie_word_embeddings", True)
    parameters = vocab * h * (1 if tied else 2) + layers * per_layer + h
    return ModelShape(parameters, layers, linears, hidden=h, heads=heads, vocab=vocab, tied=bool(tied), qk_norm=kind == "qwen3")


def tiny_config(scale) -> dict:
    """The ``config.json`` fields of a tiny scale's model (``models.tiny.build_tiny_model``)."""
    from matrixrl.models.tiny import CHARACTERS, SPECIAL_TOKENS

    return {
        "model_type": "qwen3",
        "hidden_size": scale.hidden_size,
        "intermediate_size": scale.intermediate_size,
        "num_hidden_layers": scale.num_layers,
        "num_attention_heads": scale.num_heads,
        "num_key_value_heads": scale.num_kv_heads,
        "head_dim": scale.hidden_size // scale.num_heads,
        "vocab_size": len(SPECIAL_TOKENS) + len(CHARACTERS),
        "tie_word_embeddings": True,
    }


def hf_config(scale) -> dict | None:
    """An hf scale's ``config.json``: in its folder, or in the local Hugging Face cache (None: neither)."""
    folder = Path(scale.path)
    path: Path | None = folder / "config.json" if folder.is_dir() else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(scale.path, "config.json", revision=scale.revision)
        except ValueError:  # not a valid repo id for the cache (HFValidationError)
            cached = None
        path = Path(cached) if isinstance(cached, str) else None
    try:
        config = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    # Multimodal configs nest the language model's fields.
    return config.get("text_config", config) if isinstance(config, dict) else None


@dataclass(frozen=True)
class CheckpointSize:
    trained: int  # a checkpoint after step 0: weights and optimizer state
    first: int  # the step-0 checkpoint: weights only
    measured: bool


def computed_size(spec) -> CheckpointSize | None:
    """One checkpoint's size from the cell's model shape (None: the shape is unknown here)."""
    from matrixrl.workflows import WORKFLOWS

    config = tiny_config(spec.scale) if spec.scale.kind == "tiny" else hf_config(spec.scale)
    shape = decoder_shape(config) if config is not None else None
    if shape is None:
        return None
    sets = 1 if spec.cell.policy == "shared" else len(WORKFLOWS[spec.cell.workflow].roles)
    if spec.policies.adapter == "lora":
        weights = shape.lora_parameters(spec.policies.lora.rank, spec.policies.lora.target_modules) * _MASTER_BYTES
    else:
        weights = shape.parameters * _MASTER_BYTES
    return CheckpointSize(trained=sets * 3 * weights, first=sets * weights, measured=False)  # AdamW: 2 moments


def measured_size(cell_dir: Path) -> CheckpointSize | None:
    """One checkpoint's size as the cell's largest complete trained checkpoint on disk (None: none yet)."""
    from matrixrl.train.checkpoints import complete_checkpoints, folder_bytes

    present = complete_checkpoints(cell_dir)
    trained = max((folder_bytes(L.checkpoint_dir(cell_dir, s)) for s in present if s > 0), default=None)
    if trained is None:
        return None
    first = folder_bytes(L.checkpoint_dir(cell_dir, 0)) if 0 in present else trained // 3
    return CheckpointSize(trained=trained, first=first, measured=True)


@dataclass(frozen=True)
class DiskEstimate:
    peak: int  # bytes of checkpoints at the peak of the run, under the grid's settings
    all: int  # what keeping every checkpoint would take
    modes: tuple[str, ...]  # the keep_checkpoints values of the grid's cells
    in_flight: int  # cells counted with their whole set
    unknown: tuple[str, ...]  # scales whose checkpoint size cannot be known here

    def line(self) -> str:
        """What ``plan`` prints."""
        from matrixrl.retention import format_bytes

        modes = "/".join(self.modes)
        if self.unknown and not self.all:
            return (
                f"disk at peak: unknown: no model config on this machine for {', '.join(self.unknown)} "
                "(`hf download MODEL` fetches it)"
            )
        text = f"disk at peak: ~{format_bytes(self.peak)} of checkpoints (train.keep_checkpoints: {modes}"
        text += f"; all: ~{format_bytes(self.all)})" if self.all != self.peak else ")"
        if self.in_flight:
            text += f", with up to {self.in_flight} {'cell' if self.in_flight == 1 else 'cells'} unpruned at once"
        if self.unknown:
            text += f"; not counted: {', '.join(self.unknown)} (no model config on this machine)"
        return text


def disk_at_peak(config, in_flight: int) -> DiskEstimate:
    """The checkpoints' disk at the peak of running ``config``'s grid with ``in_flight`` jobs at once."""
    from matrixrl import grid as G

    results = Path(config.results_dir)
    kept_total, full_total, unpruned, unknown, modes = 0, 0, [], [], set()
    for cell in G.runs(config):
        spec = G.cell_spec(config, cell)
        cell_dir = results / L.cell_dir(cell.id)
        size = measured_size(cell_dir) or computed_size(spec)
        if size is None:
            unknown.append(cell.scale)
            continue
        mode = spec.train.keep_checkpoints
        modes.add(mode)
        saves = len(G.save_steps(spec.train))
        full = size.first + size.trained * (saves - 1)
        if (cell_dir / L.RETENTION_FILE).exists():  # pruned: what is left of it is what it keeps
            from matrixrl.train.checkpoints import folder_bytes

            kept = folder_bytes(L.checkpoints_dir(cell_dir))
        else:
            kept = full if mode == "all" else min(full, size.trained * min(saves, KEY_AT_MOST))
            unpruned.append(full - kept)
        kept_total += kept
        full_total += full
    peak = kept_total + sum(sorted(unpruned, reverse=True)[: max(in_flight, 0)])
    return DiskEstimate(
        peak=peak,
        all=max(full_total, peak),
        modes=tuple(sorted(modes)) or ("key",),
        in_flight=min(max(in_flight, 0), len(unpruned)),
        unknown=tuple(dict.fromkeys(unknown)),
    )
