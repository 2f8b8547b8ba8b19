"""The decode engine: a static KV cache and a device-resident decode step, graphed on CUDA.

docs/architecture.md, "Decoding on CUDA"; docs/performance.md, "The decode engine".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from matrixrl.train.engine_plan import CHECK_EVERY, PROJECTIONS, bucket_length, bucket_rows
from matrixrl.train.samplers import keyed_scores

SUPPORTED = {"Qwen3ForCausalLM": True, "LlamaForCausalLM": False}
"""Architectures the step computes, and whether their attention normalises queries and keys (q_norm, k_norm)."""


class Unsupported(Exception):
    """The engine cannot decode this model; the message says why (one line)."""


# --- weights -----------------------------------------------------------------------------------


def _base_of(model):
    """The transformers model under a PEFT wrapper, or ``model`` itself."""
    get = getattr(model, "get_base_model", None)
    return get() if get is not None else model


def unsupported_reason(model) -> str | None:
    """Why the step cannot compute ``model`` (None when it can)."""
    base = _base_of(model)
    name = type(base).__name__
    if name not in SUPPORTED:
        return f"{name} is not a layer structure the engine computes (Qwen3, Llama)"
    config = base.config
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')!r} (the engine computes the default RoPE)"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "biases in the attention or MLP projections"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (the engine computes SiLU)"
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    for module_name, module in base.named_modules():
        if hasattr(module, "lora_A"):
            leaf = module_name.rsplit(".", 1)[-1]
            active = [a for a in module.active_adapters if a in module.lora_A]
            if leaf not in PROJECTIONS:
                return f"a LoRA adapter on {leaf} (the engine merges adapters on the seven projections)"
            if len(active) > 1:
                return f"{len(active)} adapters active at once on {module_name}"
            if any(getattr(module, "use_dora", {}).get(a, False) for a in active):
                return "DoRA adapters"
            if any(getattr(module, "lora_bias", {}).get(a, False) for a in active):
                return "LoRA biases"
    return None


def _projection(layer, name: str):
    """(weight, lora A, lora B, scale) of one projection of a decoder layer; A and B None without
    an active adapter (or with adapters disabled or already merged into the weight)."""
    module = getattr(layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp, name)
    if not hasattr(module, "lora_A"):
        return module.weight, None, None, 0.0
    weight = module.base_layer.weight
    active = [a for a in module.active_adapters if a in module.lora_A]
    if module.disable_adapters or module.merged or not active:
        return weight, None, None, 0.0
    a = active[0]
    return weight, module.lora_A[a].weight, module.lora_B[a].weight, float(module.scaling[a])


@dataclass
class Linear:
    """One matrix product of the step: ``x @ weight.T``, plus ``(x @ a.T) @ b.T`` when unmerged
    (``b`` already scaled)."""

    weight: torch.Tensor
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.a is not None:
            y = y + F.linear(F.linear(x, self.a), self.b)
        return y


@dataclass
class Layer:
    in_norm: torch.Tensor
    qkv: list[Linear]  # one fused product (merged), or q, k and v (unmerged)
    qk_norm: torch.Tensor | None  # (query heads + KV heads, head_dim), or None (Llama)
    o: Linear
    post_norm: torch.Tensor
    gate_up: list[Linear]  # one fused product, or gate and up
    down: Linear


class DecodeWeights:
    """The weights the step reads, in the compute dtype, refilled from a model before each call
    (``load``). Merged: q, k, v (and gate, up) fused into one matrix holding ``W + scale * B @ A``;
    unmerged: the model's own weights, with the adapter's A and B applied inside the step."""

    def __init__(self, dtype: torch.dtype, device, lora: str = "merged"):
        if lora not in ("merged", "unmerged"):
            raise ValueError(f"lora must be 'merged' or 'unmerged', not {lora!r}")
        self.dtype, self.device, self.lora = dtype, torch.device(device), lora
        self._buffers: dict[str, torch.Tensor] = {}

    def _buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        held = self._buffers.get(name)
        if held is None or tuple(held.shape) != shape:
            held = self._buffers[name] = torch.empty(shape, dtype=self.dtype, device=self.device)
        return held

    def _as(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` in the compute dtype, itself when it already is (no copy)."""
        return tensor.detach().to(device=self.device, dtype=self.dtype).contiguous()

    @torch.no_grad()
    def load(self, model) -> None:
        """Fill the copy from ``model`` (a transformers model or a PEFT model with its active adapter),
        in float32 arithmetic whatever autocast context it is called in."""
        reason = unsupported_reason(model)
        if reason:
            raise Unsupported(reason)
        with torch.autocast(self.device.type, enabled=False):  # autocast would merge in 16 bits
            self._load(model)

    def _load(self, model) -> None:
        base = _base_of(model)
        config = base.config
        self.qk_norm = SUPPORTED[type(base).__name__]
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        self.eps = config.rms_norm_eps
        theta = config.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float, device=self.device) / self.head_dim))
        inner = base.model
        self.embed = self._as(inner.embed_tokens.weight)
        self.final_norm = self._as(inner.norm.weight)
        self.lm_head = self._as(base.lm_head.weight)
        self.layers = [self._layer(i, layer) for i, layer in enumerate(inner.layers[: config.num_hidden_layers])]

    def _layer(self, i: int, layer) -> Layer:
        parts = {name: _projection(layer, name) for name in PROJECTIONS}
        attn = layer.self_attn
        qk_norm = None
        if self.qk_norm:
            qk_norm = torch.cat(
                [attn.q_norm.weight.detach().expand(self.heads, -1), attn.k_norm.weight.detach().expand(self.kv_heads, -1)]
            )
            qk_norm = self._as(qk_norm)
        if self.lora == "merged":
            qkv = [Linear(self._merged(f"{i}.qkv", [parts[n] for n in ("q_proj", "k_proj", "v_proj")]))]
            gate_up = [Linear(self._merged(f"{i}.gate_up", [parts["gate_proj"], parts["up_proj"]]))]
            o = Linear(self._merged(f"{i}.o", [parts["o_proj"]]))
            down = Linear(self._merged(f"{i}.down", [parts["down_proj"]]))
        else:
            qkv = [self._unmerged(parts[n]) for n in ("q_proj", "k_proj", "v_proj")]
            gate_up = [self._unmerged(parts[n]) for n in ("gate_proj", "up_proj")]
            o, down = self._unmerged(parts["o_proj"]), self._unmerged(parts["down_proj"])
        return Layer(self._as(layer.input_layernorm.weight), qkv, qk_norm, o, self._as(layer.post_attention_layernorm.weight), gate_up, down)

    def _merged(self, name: str, parts) -> torch.Tensor:
        """The products of ``parts`` stacked in one buffer: each ``W + scale * B @ A``, summed in float32."""
        rows = sum(w.shape[0] for w, *_ in parts)
        out = self._buffer(name, (rows, parts[0][0].shape[1]))
        at = 0
        for weight, a, b, scale in parts:
            n = weight.shape[0]
            if a is None:
                out[at : at + n].copy_(weight)
            else:
                out[at : at + n].copy_(torch.addmm(weight.float(), b.float(), a.float(), alpha=scale))
            at += n
        return out

    def _unmerged(self, part) -> Linear:
        weight, a, b, scale = part
        if a is None:
            return Linear(self._as(weight))
        return Linear(self._as(weight), self._as(a), self._as(b.float() * scale))

    def copy_bytes(self) -> int:
        """Bytes of the inference copy the engine holds (the fused, merged projections)."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())


# --- the step ----------------------------------------------------------------------------------


@dataclass
class Sampler:
    """How the step picks tokens: ``greedy``, ``training`` (softmax(logits / temperature) sampled
    with torch's generator as ``samplers.SampledChooser`` draws, its log-probs and entropies
    recorded) or ``keyed`` (``samplers.keyed_scores`` with each row's ``keys``)."""

    kind: str
    temperature: float = 1.0
    keys: torch.Tensor | None = None  # keyed: one int64 key per row of the call


@dataclass
class Outputs:
    """Per row of the call (one extra row for the bucket's empty slots) and output position."""

    tokens: torch.Tensor
    logps: torch.Tensor | None
    entropies: torch.Tensor | None

    @classmethod
    def allocate(cls, batch: int, steps: int, sampler: Sampler, device) -> Outputs:
        tokens = torch.zeros((batch + 1, steps), dtype=torch.long, device=device)
        if sampler.kind != "training":
            return cls(tokens, None, None)
        zeros = lambda: torch.zeros((batch + 1, steps), dtype=torch.float32, device=device)  # noqa: E731
        return cls(tokens, zeros(), zeros())


@dataclass
class State:
    """A bucket's decoding state, every part a device tensor (``slots`` rows).

    ``k``/``v``: per layer (slots, KV heads, length, head_dim); ``mask``: (slots, length), added
    to the attention's scores (0 or -inf); ``col``: (1,) the cache column the next token is written
    to; ``step``: () the output position of the next token; ``pos``: its RoPE position per slot;
    ``token``: the token fed per slot; ``live``: whether the slot's row still generates;
    ``out_rows``: the call's row each slot writes its outputs to (``batch`` for an empty slot);
    ``src_rows``: the row of the call's sampling noise and keys a slot takes.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    mask: torch.Tensor
    col: torch.Tensor
    step: torch.Tensor
    pos: torch.Tensor
    token: torch.Tensor
    live: torch.Tensor
    out_rows: torch.Tensor
    src_rows: torch.Tensor
    keys: torch.Tensor | None = None
    attn_mask: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.attn_mask = self.mask[:, None, None, :]

    @property
    def slots(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers computes it: in float32, cast back before the weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _products(x: torch.Tensor, linears: list[Linear]) -> torch.Tensor:
    return linears[0](x) if len(linears) == 1 else torch.cat([lin(x) for lin in linears], dim=-1)


def _layer(w: DecodeWeights, layer: Layer, i: int, x: torch.Tensor, s: State, cos, sin) -> torch.Tensor:
    slots, heads, kv, hd = x.shape[0], w.heads, w.kv_heads, w.head_dim
    qkv = _products(_rms(x, layer.in_norm, w.eps), layer.qkv)
    qk = qkv[:, : (heads + kv) * hd].view(slots, heads + kv, hd)
    value = qkv[:, (heads + kv) * hd :].view(slots, kv, 1, hd)
    if layer.qk_norm is not None:
        qk = _rms(qk, layer.qk_norm, w.eps)
    qk = qk * cos + _rotate_half(qk) * sin
    # Query heads grouped by the KV head they read (head h reads KV head h // group): the group is
    # the query length of an ordinary attention over that KV head, no copy of the cache.
    query = qk[:, :heads].view(slots, kv, heads // kv, hd)
    s.k[i].index_copy_(2, s.col, qk[:, heads:].unsqueeze(2))
    s.v[i].index_copy_(2, s.col, value)
    attended = F.scaled_dot_product_attention(query, s.k[i], s.v[i], attn_mask=s.attn_mask)
    x = x + layer.o(attended.reshape(slots, heads * hd))
    gate_up = _products(_rms(x, layer.post_norm, w.eps), layer.gate_up)
    return x + layer.down(F.silu(gate_up[:, : w.intermediate]) * gate_up[:, w.intermediate :])


def choose(logits: torch.Tensor, s: State, out: Outputs, sampler: Sampler, batch: int) -> torch.Tensor:
    """The slots' next tokens from their float32 ``logits``, written to ``out`` at ``s.step``."""
    step = s.step.expand(s.slots)
    if sampler.kind == "greedy":
        chosen = logits.argmax(dim=-1)
    elif sampler.kind == "keyed":
        chosen = keyed_scores(logits, s.keys, s.step, sampler.temperature).argmax(dim=-1)
    else:
        scaled = logits / sampler.temperature
        logp = torch.log_softmax(scaled, dim=-1)
        out.entropies.index_put_((s.out_rows, step), -(torch.exp(logp) * logp).sum(-1))
        # The noise SampledChooser draws: the whole call's rows at every step, whatever is left.
        noise = torch.empty((batch, logits.shape[-1]), dtype=torch.float32, device=logits.device).exponential_(1)
        chosen = (torch.softmax(scaled, dim=-1) / noise[s.src_rows]).argmax(dim=-1)
        out.logps.index_put_((s.out_rows, step), logp.gather(-1, chosen[:, None]).squeeze(-1))
    out.tokens.index_put_((s.out_rows, step), chosen)
    return chosen


def decode_step(w: DecodeWeights, s: State, out: Outputs, sampler: Sampler, *, batch: int, eos: int, pad: int) -> None:
    """One token for every slot of ``s``: the forward pass of the token each slot is fed, its
    key and value written into the cache at ``s.col``, the next token chosen and recorded,
    the state advanced. Only device tensors are read and written: no host synchronisation."""
    x = F.embedding(s.token, w.embed)
    s.mask.index_fill_(1, s.col, 0.0)
    freqs = s.pos[:, None].float() * w.inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    cos, sin = angles.cos().to(w.dtype), angles.sin().to(w.dtype)
    for i, layer in enumerate(w.layers):
        x = _layer(w, layer, i, x, s, cos, sin)
    logits = F.linear(_rms(x, w.final_norm, w.eps), w.lm_head).float()
    chosen = choose(logits, s, out, sampler, batch)
    s.live &= chosen != eos
    s.token.copy_(torch.where(s.live, chosen, pad))
    s.pos.add_(1)
    s.col.add_(1)
    s.step.add_(1)


# --- the driver --------------------------------------------------------------------------------


@dataclass
class Decoded:
    """A call's rows: tokens up to and including the first EOS (at most ``max_new_tokens``), and
    with the training sampler each token's log-prob and the entropy it was sampled from."""

    tokens: list[list[int]]
    logps: list[list[float]] | None = None
    entropies: list[list[float]] | None = None


class Engine:
    """Decodes calls with ``decode_step`` over one ``DecodeWeights`` copy (``lora``: merged or unmerged)."""

    def __init__(self, *, lora: str = "merged", graphs: bool | None = None, check_every: int = CHECK_EVERY, log: Callable[[str], None] = print):
        self.lora, self.graphs, self.check_every, self.log = lora, graphs, check_every, log
        self.weights: DecodeWeights | None = None
        self.said: set[str] = set()
        self.switches = 0  # bucket switches of the last call (rows dropped or cache grown)
        self.captures = 0  # graphs captured in the last call

    def say(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            self.log(line)

    def load(self, model, dtype: torch.dtype) -> bool:
        """Fill the inference copy from ``model`` (merging its active adapter); False, with the one
        line saying why, when the engine cannot compute it. A merged copy that does not fit on the
        device makes the engine unmerged from then on, after one line saying so."""
        device = next(model.parameters()).device
        if self.weights is None or self.weights.dtype != dtype or self.weights.device != device:
            self.weights = DecodeWeights(dtype, device, self.lora)
        try:
            self.weights.load(model)
        except Unsupported as exc:
            self.say(f"rollout: decoding with the eager decoder: the engine does not compute {exc}")
            return False
        except torch.OutOfMemoryError:
            if self.lora == "unmerged":
                raise
            self.say(f"rollout: adapters unmerged in the decode step: the merged copy of the weights does not fit on {device}")
            self.lora, self.weights = "unmerged", None
            return self.load(model, dtype)
        return True

    @torch.no_grad()
    def decode(self, model, input_ids, attention_mask, cache, *, max_new_tokens: int, eos: int, pad: int, sampler: Sampler) -> Decoded | None:
        """The call decoded (after ``load``); None, with one line saying why, when its cache does not
        fit on the device (the caller then decodes with ``rollout.decode``, from a fresh prefill)."""
        from transformers import DynamicCache

        from matrixrl.models.versions import check_kv_cache_kept

        batch, width = input_ids.shape
        device = input_ids.device
        self.switches = self.captures = 0
        need = width + max_new_tokens - 1  # the cache columns the last token is written to, and before

        # The first pass, as rollout.decode makes it (the same inputs, positions and mask).
        mask = attention_mask
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        padded = not bool(mask.all())
        if cache is None:
            cache = DynamicCache(config=model.config)
            inputs, attention = input_ids, (mask if padded else None)
        else:
            inputs, attention = input_ids[:, -1:], (mask.bool()[:, None, None, :] if padded else None)
            positions = positions[:, -1:]
        kept = cache.get_seq_length() + inputs.shape[1]
        logits = model(input_ids=inputs, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1).logits
        check_kv_cache_kept(cache, kept)
        try:
            s = self._allocate(bucket_rows(batch), bucket_length(need), batch, sampler, cache)
        except torch.OutOfMemoryError:
            self.say(f"rollout: decoding with the eager decoder: a cache of {bucket_rows(batch)} rows x {bucket_length(need)} positions does not fit on {device}")
            return None
        out = Outputs.allocate(batch, max_new_tokens, sampler, device)
        s.mask[:batch, :width].masked_fill_(mask.bool(), 0.0)
        s.pos[:batch].copy_(positions[:, -1] + 1)
        s.col.fill_(width)
        scores = torch.zeros((s.slots, logits.shape[-1]), dtype=torch.float32, device=device)
        scores[:batch] = logits[:, -1].float()
        chosen = choose(scores, s, out, sampler, batch)
        s.live[:batch] = chosen[:batch] != eos
        s.token.copy_(torch.where(s.live, chosen, pad))
        s.step.fill_(1)

        done, graphed = 1, self.graphs if self.graphs is not None else device.type == "cuda"
        with torch.autocast(device.type, enabled=False):  # the copy is in the compute dtype already
            while done < max_new_tokens:
                going = int(s.live.sum())  # the host's one wait for the device, every check_every steps
                if going == 0:
                    break
                n = min(self.check_every, max_new_tokens - done)
                slots = bucket_rows(going)
                length = min(s.k_full[0].shape[2], bucket_length(width + done - 1 + n))
                if slots < s.slots or length != s.length:
                    s = self._switch(s, slots, length)
                graphed = self._run(s, out, sampler, n, batch, eos, pad, graphed)
                done += n
        steps = out.tokens[:batch, :done].tolist()
        tokens = [row[: row.index(eos) + 1] if eos in row else row for row in steps]
        if sampler.kind != "training":
            return Decoded(tokens)
        return Decoded(tokens, out.logps[:batch, :done].tolist(), out.entropies[:batch, :done].tolist())

    def _allocate(self, slots: int, length: int, batch: int, sampler: Sampler, cache) -> State:
        """The bucket's state, its cache filled from the first pass's ``cache``, whose layers are
        released one by one as they are copied (the two caches are never held whole together)."""
        w = self.weights
        device = w.device
        shape = (slots, w.kv_heads, length, w.head_dim)
        k_full, v_full = [], []
        for layer in cache.layers[: len(w.layers)]:
            for full, held in ((k_full, layer.keys), (v_full, layer.values)):
                full.append(torch.zeros(shape, dtype=w.dtype, device=device))
                full[-1][:batch, :, : held.shape[2]].copy_(held)
            layer.keys = layer.values = None
        mask_full = torch.full((slots, length), float("-inf"), dtype=w.dtype, device=device)
        mask_full[batch:, 0] = 0.0  # an empty slot attends to one (zero) position: no NaN
        rows = torch.arange(slots, device=device)
        keys = None
        if sampler.kind == "keyed":
            keys = torch.zeros(slots, dtype=torch.int64, device=device)
            keys[:batch] = sampler.keys.to(device)
        s = self._view(
            k_full, v_full, mask_full, 0,
            col=torch.zeros(1, dtype=torch.long, device=device),
            step=torch.zeros((), dtype=torch.long, device=device),
            pos=torch.zeros(slots, dtype=torch.long, device=device),
            token=torch.full((slots,), 0, dtype=torch.long, device=device),
            live=torch.zeros(slots, dtype=torch.bool, device=device),
            out_rows=rows.clamp(max=batch), src_rows=torch.where(rows < batch, rows, 0), keys=keys,
        )  # fmt: skip
        return s

    @staticmethod
    def _view(k_full, v_full, mask_full, length, **state) -> State:
        """A state reading the first ``length`` columns of full-length cache storages (all of them when 0)."""
        length = length or mask_full.shape[1]
        s = State([k[:, :, :length] for k in k_full], [v[:, :, :length] for v in v_full], mask_full[:, :length], **state)
        s.k_full, s.v_full, s.mask_full = k_full, v_full, mask_full
        s.graph = None
        return s

    def _switch(self, s: State, slots: int, length: int) -> State:
        """``s`` in a bucket of ``slots`` rows reading ``length`` columns: the live rows first, finished
        ones riding along to fill it (their outputs past their EOS are never read)."""
        self.switches += 1
        state = dict(col=s.col, step=s.step)
        if slots == s.slots:
            k_full, v_full, mask_full = s.k_full, s.v_full, s.mask_full
            state.update(pos=s.pos, token=s.token, live=s.live, out_rows=s.out_rows, src_rows=s.src_rows, keys=s.keys)
        else:
            order = torch.argsort((~s.live).to(torch.int8), stable=True)[:slots]  # live slots first
            used = s.length
            k_full, v_full = [], []
            for full, olds in ((k_full, s.k_full), (v_full, s.v_full)):
                for old in olds:
                    # zeros past the copied columns: a masked position still multiplies its value by 0
                    new = torch.zeros((slots, *old.shape[1:]), dtype=old.dtype, device=old.device)
                    new[:, :, :used] = old[order, :, :used]
                    full.append(new)
            mask_full = s.mask_full[order]
            state.update(
                pos=s.pos[order], token=s.token[order], live=s.live[order], out_rows=s.out_rows[order],
                src_rows=s.src_rows[order], keys=None if s.keys is None else s.keys[order],
            )  # fmt: skip
        return self._view(k_full, v_full, mask_full, length, **state)

    def _run(self, s: State, out: Outputs, sampler: Sampler, n: int, batch: int, eos: int, pad: int, graphed: bool) -> bool:
        """``n`` steps of ``s``'s bucket: eagerly, or as replays of its graph (captured after one
        eager warm-up step). Returns whether graphs are still to be used (a failed capture says why
        once and the call goes on eagerly)."""

        def step():
            decode_step(self.weights, s, out, sampler, batch=batch, eos=eos, pad=pad)

        if not graphed:
            for _ in range(n):
                step()
            return False
        if s.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # a real step, which also warms the kernels up before the capture
            torch.cuda.current_stream().wait_stream(side)
            n -= 1
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    step()  # recorded, not run
            except Exception as exc:  # noqa: BLE001 - any failure to capture falls back, with its reason
                self.say(f"rollout: decoding without CUDA graphs: capturing the step failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
                for _ in range(n):
                    step()
                return False
            s.graph = graph
            self.captures += 1
        for _ in range(n):
            s.graph.replay()
        return True
