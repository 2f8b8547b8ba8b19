"""A cell's model as its jobs hold it: bytes per parameter, token and row, from its config.json.

docs/real-models.md, "The parts of an estimate".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from matrixrl.disk import ModelShape, decoder_shape, hf_config, tiny_config

LOGIT_BYTES_TORCH = 12
"""Bytes per completion position and vocabulary entry at the update's backward peak on TRL's torch
path of ``selective_log_softmax`` (CPU, and a GPU without Triton), measured on CPU (bench/gpu_memory.py)."""

LOGIT_BYTES_TRITON = 8
"""The same on a CUDA device with Triton, where TRL 1.16 runs its fused kernel, derived from the
kernel's allocations (docs/performance.md, "TRL's Triton log-softmax")."""

LOGIT_BYTES = max(LOGIT_BYTES_TORCH, LOGIT_BYTES_TRITON)
"""What the estimate counts (see matrixrl.gpu_memory.peak): the larger of the two paths, so that it
holds wherever a job runs."""

SAMPLING_BYTES = {"sampled": 24, "keyed": 40, "greedy": 0}
"""Bytes per row and vocabulary entry of a decoding step's chooser beyond the logits and their
float32 copy (train.samplers: SampledChooser, keyed_chooser, greedy_chooser)."""


@dataclass(frozen=True)
class JobModel:
    """A cell's model as its jobs hold it: shapes, compute dtype, adapter, parameter sets, device."""

    shape: ModelShape
    compute: int  # bytes of the compute dtype: 2 (bfloat16) or 4 (float32)
    adapter: str  # "full", "lora", or "frozen" (never trains; stored in the compute dtype: a memory job's on a GPU)
    rank: int
    targets: frozenset[str]
    sets: int  # parameter sets: 1 (shared) or one per role (isolated)
    device: str  # "cuda" or "cpu"
    checkpointing: bool = False
    merged: bool = True  # LoRA on CUDA: merged into the decode engine's inference copy (else read unmerged)

    @property
    def full(self) -> bool:
        return self.adapter == "full"

    @property
    def widths(self) -> tuple[int, int, int, int]:
        """(hidden, query, key/value, MLP) widths of a decoder layer."""
        linears = self.shape.linears
        return linears["q_proj"][0], linears["q_proj"][1], linears["k_proj"][1], linears["gate_proj"][1]

    @property
    def adapter_parameters(self) -> int:
        return 0 if self.adapter == "frozen" else self.shape.lora_parameters(self.rank, self.targets)

    @property
    def trained(self) -> int:
        """Trained parameters of one set."""
        return self.shape.parameters if self.full else self.adapter_parameters

    @property
    def matmul_parameters(self) -> int:
        """Parameters of the linear layers and the output layer: what autocast casts."""
        return self.shape.layers * sum(i * o for i, o in self.shape.linears.values()) + self.shape.vocab * self.shape.hidden

    def weights(self) -> int:
        if self.full:
            return self.sets * self.shape.parameters * 4
        return self.shape.parameters * self.compute + self.sets * self.adapter_parameters * 4

    def autocast_copies(self) -> int:
        """16-bit copies of one set's float32 weights that a forward pass or ``generate`` call caches."""
        if self.compute == 4:
            return 0
        return 2 * (self.matmul_parameters if self.full else self.adapter_parameters)

    def decode_autocast_copies(self) -> int:
        """Autocast's copies during a ``generate`` call: none for a full fine-tune on CUDA, whose
        decode engine reads its inference copy (which replaces them), else :meth:`autocast_copies`."""
        return 0 if self.full and self.device == "cuda" else self.autocast_copies()

    def inference_copy(self) -> int:
        """The decode engine's copy of the weights its graph reads, in the compute dtype (CUDA only):
        a full fine-tune's linear and output layers; under LoRA all seven projections, the adapted
        ones with the role's adapter merged in, as bench/gpu_timing.py's ``copy_bytes`` (none when adapters stay
        unmerged); none for a frozen model."""
        if self.device != "cuda" or self.adapter == "frozen" or (self.adapter == "lora" and not self.merged):
            return 0
        if self.full:
            return self.compute * self.matmul_parameters
        return self.compute * self.shape.layers * sum(i * o for i, o in self.shape.linears.values())

    def largest_trained_tensor(self) -> int:
        if self.full:
            return self.shape.vocab * self.shape.hidden
        return max(self.rank * max(i, o) for name, (i, o) in self.shape.linears.items() if name in self.targets)

    # --- generation -----------------------------------------------------------------------

    def kv_per_token(self) -> int:
        """KV cache bytes per token, all layers: keys in float32 under a 16-bit full fine-tune."""
        key = 4 if (self.compute == 4 or self.full) else self.compute
        return self.shape.layers * self.widths[2] * (key + self.compute)

    def prefill_per_token(self) -> int:
        """A no-grad forward pass's live tensors per token beside the cache: the MLP's
        activation, up projection and product, and two residual-stream tensors; a LoRA adapter
        on up_proj one more MLP-width tensor and a float32 copy of its input
        (docs/performance.md, "The first GPU window")."""
        residual = 4 if (self.full or self.compute == 4) else self.compute
        per_token = 3 * self.compute * self.widths[3] + 2 * residual * self.shape.hidden
        if self.adapter == "lora" and "up_proj" in self.targets:
            per_token += self.compute * self.widths[3] + (4 * self.shape.hidden if self.compute != 4 else 0)
        return per_token

    def logits_per_row(self, chooser: str) -> int:
        """A decoding step's bytes per row: last-position logits, their float32 copy, the chooser's temporaries."""
        copy = 4 if self.compute != 4 else 0
        return self.shape.vocab * (self.compute + copy + SAMPLING_BYTES[chooser])

    # --- the update ---------------------------------------------------------------------------

    def saves_input(self, module: str) -> bool:
        return self.full or module in self.targets

    def _group_input(self, width: int, modules: Iterable[str]) -> int:
        """Saved inputs of linear layers that read one tensor: in float32 the tensor itself,
        once; in 16-bit one autocast cast per layer that saves it (LoRA: its adapter's)."""
        saving = sum(self.saves_input(m) for m in modules)
        if not saving:
            return 0
        return 4 * width if self.compute == 4 else self.compute * width * saving

    def layer_bytes(self, length: int) -> int:
        """What autograd saves per token in one decoder layer, for rows padded to ``length``."""
        c, (h, qd, kvd, i) = self.compute, self.widths
        norm = 4 * h + (4 * h if self.full else 0)  # the float32 input (and the normalised input for its weight)
        saved = norm + self._group_input(h, ("q_proj", "k_proj", "v_proj"))
        if self.shape.qk_norm:
            saved += (4 + (c if self.full else 0)) * (qd + kvd)
        saved += 4 * c * qd + c * length + 4 * self.shape.heads  # SDPA: q, repeated k and v, out; mask; log-sum-exp
        if c != 4 and not self.full and "o_proj" in self.targets:
            saved += c * qd  # PEFT takes a 16-bit input to float32 for the adapter, which autocast casts back
        saved += norm + self._group_input(h, ("gate_proj", "up_proj"))
        saved += 3 * c * i + (c * i if self.saves_input("down_proj") else 0)
        if not self.full:
            saved += c * self.rank * len(self.targets & set(self.shape.linears))
        return saved

    def activations(self, rows: int, length: int, kept: int) -> int:
        """Saved activations of a micro-batch of ``rows`` × ``length`` tokens whose output layer
        sees ``kept`` positions per row."""
        tokens, h = rows * length, self.shape.hidden
        layers = self.shape.layers
        if self.checkpointing:  # each layer's input, and one layer recomputed in the backward pass
            residual = 4 if (self.full or self.compute == 4) else self.compute
            body = tokens * (layers * residual * h + self.layer_bytes(length))
        else:
            body = tokens * layers * self.layer_bytes(length)
        final = tokens * (4 * h + (4 * h if self.full else 0))  # the last norm
        if self.full:  # the output layer's input
            final += tokens * 4 * h if self.compute == 4 else rows * kept * self.compute * h
        return body + final

    def logits(self, rows: int, length: int, completion: int, kept: int) -> int:
        return rows * self.shape.vocab * (LOGIT_BYTES * completion + self.compute * (kept - completion))

    def layer_gradients(self, tokens: int) -> int:
        """A decoder layer's gradients in the backward pass beyond what it frees: two of the
        MLP's width and a few of the residual stream's (an approximation: within 10% of the
        saved activations on tiny models, where it matters; negligible at real vocabularies,
        where the logits' gradients are far larger)."""
        grad = 4 if self.compute == 4 else self.compute
        return tokens * (2 * grad * self.widths[3] + 12 * self.shape.hidden)


def job_device(scale) -> str:
    """Where a job of ``scale`` runs: tiny scales and ``device: cpu`` on CPU, other hf scales on a GPU."""
    return "cpu" if scale.kind == "tiny" or scale.device == "cpu" else "cuda"


def compute_bytes(scale, device: str) -> int:
    if scale.kind == "tiny":
        return 4
    dtype = scale.dtype if scale.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    return 4 if dtype == "float32" else 2


def model_config(scale) -> dict | None:
    """The config.json fields of ``scale``'s model, or None where this machine has none."""
    return tiny_config(scale) if scale.kind == "tiny" else hf_config(scale)


def memory_job_model(scale, config: dict | None = None, device: str | None = None) -> JobModel | None:
    """The model of a memory job (collect, label, distill) of ``scale`` as it holds it (None: no
    config.json here): one set of weights that never trains, stored in the compute dtype on a GPU
    ("frozen") and in float32 on CPU ("full", one set), as ``jobs.memory.stored_in_compute_dtype``."""
    config = config if config is not None else model_config(scale)
    shape = decoder_shape(config) if config is not None else None
    if shape is None:
        return None
    device = device or job_device(scale)
    adapter = "frozen" if device == "cuda" else "full"
    return JobModel(shape=shape, compute=compute_bytes(scale, device), adapter=adapter, rank=0, targets=frozenset(), sets=1, device=device)


def job_model(spec, config: dict | None = None, device: str | None = None, merged: bool = True) -> JobModel | None:
    """``spec``'s model as its jobs hold it (None: no config.json for it here); ``merged``: LoRA
    merged into the decode engine's inference copy on CUDA."""
    from matrixrl.workflows import WORKFLOWS

    config = config if config is not None else model_config(spec.scale)
    shape = decoder_shape(config) if config is not None else None
    if shape is None:
        return None
    device = device or job_device(spec.scale)
    roles = WORKFLOWS[spec.cell.workflow].roles
    return JobModel(
        shape=shape,
        compute=compute_bytes(spec.scale, device),
        adapter=spec.policies.adapter,
        rank=spec.policies.lora.rank,
        targets=frozenset(spec.policies.lora.target_modules),
        sets=1 if spec.cell.policy == "shared" else len(roles),
        device=device,
        checkpointing=bool(getattr(spec.scale, "gradient_checkpointing", False)),
        merged=merged,
    )
