"""The decode engine (matrixrl.train.engine), run eagerly on CPU at Qwen3-0.6B's head layout (16
query, 8 KV heads) with tiny widths: its tokens, log-probs and entropies against rollout.decode's
through bucket switches, its op count against its analytic count, its step traced whole by
torch.compile, and its fallback. docs/performance.md, "The decode engine"."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from matrixrl.config import Policies
from matrixrl.models.policies import build_policy
from matrixrl.train import engine as engine_module
from matrixrl.train.engine import Engine, Sampler
from matrixrl.train.engine_plan import PROJECTIONS, bucket_length, bucket_rows
from matrixrl.train.rollout import decode
from matrixrl.train.samplers import SampledChooser, greedy_chooser, keyed_chooser

from conftest import script_module

ops_per_step = script_module("bench/gpu_timing.py").ops_per_step  # the engine's op count on paper

VOCAB, BATCH, PROMPT, STEPS = 48, 12, 12, 40
ROLES = ("generator", "evaluator", "judge")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny products: threads only wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(layers: int = 3, arch: str = "qwen3", **extra):
    """A random model of the 0.6B head layout; its initial scale makes greedy rows end at different steps."""
    config_class, model_class = (Qwen3Config, Qwen3ForCausalLM) if arch == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    config = config_class(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=8, head_dim=8, max_position_embeddings=2048, tie_word_embeddings=True,
        initializer_range=0.1, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    return model_class(config).eval()


def prompts():
    torch.manual_seed(1)
    ids = torch.randint(5, VOCAB, (BATCH, PROMPT))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[3, :5] = 0
    return ids.masked_fill(mask == 0, 0), mask


def policy_models(kind: str):
    """(role, model) pairs: a shared LoRA, an isolated LoRA (an adapter per role) or full models per role."""
    base = tiny()
    if kind == "full":
        policy = build_policy("isolated", base, ROLES, Policies(adapter="full"))
        for i, role in enumerate(ROLES[1:]):  # each role's model its own
            torch.manual_seed(10 + i)
            for p in policy.model_for(role).parameters():
                p.data.add_(torch.randn_like(p) * 0.01)
        return [(role, lambda role=role: policy.model_for(role)) for role in ROLES]
    mode = "shared" if kind == "shared" else "isolated"
    policy = build_policy(mode, base, ROLES, Policies(adapter="lora", lora={"rank": 4, "target_modules": list(PROJECTIONS)}))
    torch.manual_seed(2)
    for name, p in policy.model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: the adapters would change nothing
            p.data.normal_(0, 0.5)
    roles = ROLES[:1] if kind == "shared" else ROLES
    # model_for switches the active adapter: called when the role decodes
    return [(role, lambda role=role: policy.model_for(role)) for role in roles]


def eos_with_spread_ends(model, ids, mask) -> int:
    """The token whose first greedy occurrence falls at the most distinct steps across the rows."""
    full = decode(model, ids, mask, None, max_new_tokens=STEPS, eos=-1, pad=0, choose=greedy_chooser())
    return max(range(5, VOCAB), key=lambda t: len({row.index(t) for row in full if t in row}))


@pytest.mark.parametrize("kind,lora", [("shared", "merged"), ("isolated", "merged"), ("full", "merged"), ("isolated", "unmerged")])
def test_greedy_tokens_are_the_decoders_on_every_row_through_bucket_switches(kind, lora) -> None:
    ids, mask = prompts()
    engine = Engine(lora=lora, check_every=4)
    for role, model_for in policy_models(kind):
        model = model_for()
        eos = eos_with_spread_ends(model, ids, mask)
        expected = decode(model, ids, mask, None, max_new_tokens=STEPS, eos=eos, pad=0, choose=greedy_chooser())
        assert engine.load(model, torch.float32)
        got = engine.decode(model, ids, mask, None, max_new_tokens=STEPS, eos=eos, pad=0, sampler=Sampler("greedy"))
        assert got.tokens == expected, role
        ends = {len(row) for row in expected if row[-1] == eos}
        assert len(ends) >= 3, (role, ends)  # rows end at different steps...
        assert engine.switches >= 1, role  # ... and the call switched to a smaller bucket mid-way


def test_isolated_roles_decode_with_their_own_adapter() -> None:
    ids, mask = prompts()
    engine = Engine(check_every=4)
    outputs = []
    for _, model_for in policy_models("isolated"):
        model = model_for()
        engine.load(model, torch.float32)
        outputs.append(engine.decode(model, ids, mask, None, max_new_tokens=8, eos=-1, pad=0, sampler=Sampler("greedy")).tokens)
    assert outputs[0] != outputs[1] and outputs[1] != outputs[2]


def test_merging_leaves_the_trained_weights_and_the_base_as_they_were() -> None:
    model = policy_models("isolated")[1][1]()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    Engine().load(model, torch.float32)
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())


def test_the_copys_bytes_on_paper_are_the_loaded_copys() -> None:
    copy_bytes = script_module("bench/gpu_timing.py").copy_bytes  # the copy on paper

    engine = Engine()
    engine.load(policy_models("shared")[0][1](), torch.bfloat16)
    paper = copy_bytes(layers=3, hidden=64, intermediate=96, heads=16, kv_heads=8, head_dim=8, dtype_bytes=2)
    assert engine.weights.copy_bytes() == paper
    # Qwen3-0.6B: 440M parameters in the projections, 0.88 GB in bfloat16 (docs/performance.md)
    assert copy_bytes(layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128) == 28 * 15_728_640 * 2


def test_merging_sums_in_float32_inside_a_16_bit_autocast() -> None:
    """make_generate loads the copy inside the model's compute context."""
    model = policy_models("shared")[0][1]()
    plain, autocast = Engine(), Engine()
    plain.load(model, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast.load(model, torch.float32)
    assert all(torch.equal(plain.weights._buffers[k], autocast.weights._buffers[k]) for k in plain.weights._buffers)


def test_the_training_sampler_draws_the_same_tokens_and_records_their_logps_and_entropies() -> None:
    ids, mask = prompts()
    model = policy_models("shared")[0][1]()
    eos = eos_with_spread_ends(model, ids, mask)
    torch.manual_seed(5)
    chooser = SampledChooser(0.9, BATCH, STEPS, "cpu")
    expected = decode(model, ids, mask, None, max_new_tokens=STEPS, eos=eos, pad=0, choose=chooser)
    engine = Engine(check_every=4)
    engine.load(model, torch.float32)
    torch.manual_seed(5)
    got = engine.decode(model, ids, mask, None, max_new_tokens=STEPS, eos=eos, pad=0, sampler=Sampler("training", 0.9))
    assert got.tokens == expected
    assert len({len(row) for row in expected}) >= 3 and engine.switches >= 1
    for i, row in enumerate(expected):
        n = len(row)
        assert got.logps[i][:n] == pytest.approx(chooser.logps[i, :n].tolist(), abs=1e-4)
        assert got.entropies[i][:n] == pytest.approx(chooser.entropies[i, :n].tolist(), abs=1e-4)


def test_keyed_sampling_gives_the_keyed_choosers_tokens() -> None:
    ids, mask = prompts()
    model = policy_models("shared")[0][1]()
    eos = eos_with_spread_ends(model, ids, mask)
    keys = torch.arange(100, 100 + BATCH, dtype=torch.int64) * 7919
    expected = decode(model, ids, mask, None, max_new_tokens=STEPS, eos=eos, pad=0, choose=keyed_chooser(0.7, keys))
    engine = Engine(check_every=4)
    engine.load(model, torch.float32)
    got = engine.decode(model, ids, mask, None, max_new_tokens=STEPS, eos=eos, pad=0, sampler=Sampler("keyed", 0.7, keys))
    assert got.tokens == expected


class Counted(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not func.is_view  # views aside, as bench/gpu_smoke.py's count_ops
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("lora", ["merged", "unmerged"])
@pytest.mark.parametrize("sampler", ["greedy", "training", "keyed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ops_per_step_is_what_a_step_launches(monkeypatch, arch, lora, sampler, dtype) -> None:
    counts = []
    step = engine_module.decode_step

    def counted(*args, **kwargs):
        with (mode := Counted()):
            step(*args, **kwargs)
        counts.append(mode.n)

    monkeypatch.setattr(engine_module, "decode_step", counted)
    ids, mask = prompts()
    for layers in (1, 2):
        model = build_policy(
            "shared", tiny(layers, arch), ("g",), Policies(adapter="lora", lora={"rank": 4, "target_modules": list(PROJECTIONS)})
        ).model_for("g")
        engine = Engine(lora=lora, check_every=4)
        engine.load(model, getattr(torch, dtype))
        counts.clear()
        engine.decode(model, ids, mask, None, max_new_tokens=6, eos=-1, pad=0, sampler=Sampler(sampler, 1.0, torch.arange(BATCH)))
        assert len(set(counts)) == 1 and len(counts) == 5
        assert counts[0] == ops_per_step(layers, qk_norm=arch == "qwen3", lora=lora, sampler=sampler, dtype=dtype)


def test_at_qwen3_06b_a_merged_step_launches_fewer_than_2000_ops() -> None:
    assert ops_per_step(28, qk_norm=True, lora="merged", sampler="training", dtype="bfloat16") <= 2000


def test_the_step_traces_whole_with_torch_compile_fullgraph(monkeypatch) -> None:
    """No graph break: no host synchronisation or Python branch on a tensor inside a step (the
    proxy for capturing it as a CUDA graph)."""
    torch._dynamo.reset()
    compiled = torch.compile(engine_module.decode_step, fullgraph=True, backend="aot_eager")
    ids, mask = prompts()
    model = policy_models("shared")[0][1]()
    eos = eos_with_spread_ends(model, ids, mask)
    expected = decode(model, ids, mask, None, max_new_tokens=12, eos=eos, pad=0, choose=greedy_chooser())
    monkeypatch.setattr(engine_module, "decode_step", compiled)
    engine = Engine(check_every=4)
    engine.load(model, torch.float32)
    got = engine.decode(model, ids, mask, None, max_new_tokens=12, eos=eos, pad=0, sampler=Sampler("greedy"))
    assert got.tokens == expected


def test_the_buckets_come_from_a_fixed_ladder() -> None:
    assert [bucket_rows(n) for n in (1, 4, 5, 9, 13, 17, 25, 33, 100, 192, 193)] == [4, 4, 6, 12, 16, 24, 32, 48, 128, 192, 256]
    assert [bucket_length(n) for n in (1, 256, 257, 1600)] == [256, 256, 512, 1792]


def test_a_model_the_engine_does_not_compute_decodes_with_the_decoder_after_one_line() -> None:
    from matrixrl.train.rollout import make_generate

    class Tokenizer:  # ids are characters' codes modulo the vocabulary, enough for this check
        eos_token_id, pad_token_id = 7, 0

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[5 + ord(c) % (VOCAB - 5) for c in t] for t in texts]}

        def batch_decode(self, rows, skip_special_tokens=False):
            return [" ".join(map(str, r)) for r in rows]

    class Policy:
        model = tiny(2, attention_bias=True)

        def model_for(self, role):
            return self.model

    lines = []
    texts = ["abc", "hello", "abc"]
    generate = make_generate(Policy(), Tokenizer(), max_new_tokens=6, temperature=1.0, sample=False, engine=True, log=lines.append)
    reference = make_generate(Policy(), Tokenizer(), max_new_tokens=6, temperature=1.0, sample=False, engine=False)
    assert [c.completion_ids for c in generate("g", texts)] == [c.completion_ids for c in reference("g", texts)]
    generate("g", texts)
    assert lines == ["rollout: decoding with the eager decoder: the engine does not compute biases in the attention or MLP projections"]


def _tiny_policy():
    """A two-layer tiny model with 16 query / 8 KV heads and its tokenizer, behind a one-model policy."""
    from matrixrl.config import TinyScale
    from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    scale = TinyScale(kind="tiny", hidden_size=64, num_layers=2, intermediate_size=96, num_heads=16, num_kv_heads=8)
    model = build_tiny_model(scale, tokenizer, seed=0).eval()

    class Policy:
        def model_for(self, role):
            return model

    return tokenizer, Policy


def test_make_generate_with_the_engine_gives_the_decoders_completions() -> None:
    """Through make_generate on CPU (forced): repeated prompts take the prefilled cache's path."""
    from matrixrl.train.rollout import make_generate

    tokenizer, Policy = _tiny_policy()

    texts = ["1+2=", "12+30=", "1+2=", "7*8=", "12+30="]
    lines = []
    for sample in (False, True):
        outs = []
        for engine in (False, True):
            torch.manual_seed(3)
            generate = make_generate(Policy(), tokenizer, max_new_tokens=10, temperature=1.0, sample=sample, engine=engine, log=lines.append)
            outs.append(generate("g", texts))
        assert [c.completion_ids for c in outs[1]] == [c.completion_ids for c in outs[0]]
        assert [c.text for c in outs[1]] == [c.text for c in outs[0]]
        assert lines == []  # the engine decoded: no line saying it did not
        if sample:
            for a, b in zip(outs[0], outs[1]):
                assert b.sampled_logps == pytest.approx(a.sampled_logps, abs=1e-4)
                assert b.entropy_sum == pytest.approx(a.entropy_sum, abs=1e-4)


def test_a_cache_that_does_not_fit_decodes_with_the_decoder_after_one_line(monkeypatch) -> None:
    from matrixrl.train.rollout import make_generate

    tokenizer, Policy = _tiny_policy()

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(Engine, "_allocate", no_room)
    lines = []
    texts = ["1+2=", "12+30=", "1+2="]  # a repeated prompt: the prefilled cache's path
    generate = make_generate(Policy(), tokenizer, max_new_tokens=8, temperature=1.0, sample=False, engine=True, log=lines.append)
    reference = make_generate(Policy(), tokenizer, max_new_tokens=8, temperature=1.0, sample=False, engine=False)
    assert [c.completion_ids for c in generate("g", texts)] == [c.completion_ids for c in reference("g", texts)]
    generate("g", texts)
    assert lines == ["rollout: decoding with the eager decoder: a cache of 4 rows x 256 positions does not fit on cpu"]


@pytest.mark.slow
def test_the_window_script_runs_end_to_end_scaled_down_on_cpu(run_bench) -> None:
    import json

    lines = [json.loads(line) for line in run_bench("decode_engine.py", "--window", "--scale-down")]
    by = {}
    for line in lines:
        by.setdefault(line["what"], []).append(line)
    assert set(by) == {"model", "step_ms", "merge_ms", "greedy", "bandwidth", "sweep"}
    decoders = [line["decoder"] for line in by["step_ms"]]
    assert decoders[0] == "rollout.decode" and len(decoders) == 4  # the reference, then the engine's three
    assert all(isinstance(line["ms"], float) for line in by["step_ms"] + by["sweep"])  # timings are the bench's, not asserted
    assert by["greedy"][0]["rows"] == 12 and by["greedy"][0]["rows_equal"] >= 1
    assert [line["context"] for line in by["sweep"]] == [28, 64, 104]


def test_the_cache_grows_past_a_length_bucket_mid_call() -> None:
    """Prompts of 250 tokens: attention's columns grow from 256 to 512 during the call."""
    torch.manual_seed(4)
    ids = torch.randint(5, VOCAB, (BATCH, 250))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    ids = ids.masked_fill(mask == 0, 0)
    model = policy_models("shared")[0][1]()
    eos = eos_with_spread_ends(model, ids, mask)
    expected = decode(model, ids, mask, None, max_new_tokens=24, eos=eos, pad=0, choose=greedy_chooser())
    engine = Engine(check_every=4)
    engine.load(model, torch.float32)
    lengths = []
    real = Engine._switch
    engine._switch = lambda s, slots, length: lengths.append(length) or real(engine, s, slots, length)
    got = engine.decode(model, ids, mask, None, max_new_tokens=24, eos=eos, pad=0, sampler=Sampler("greedy"))
    assert got.tokens == expected
    assert 256 in lengths and 512 in lengths


def test_a_merged_copy_that_does_not_fit_leaves_the_adapters_unmerged_after_one_line(monkeypatch) -> None:
    from matrixrl.train.engine import DecodeWeights

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(DecodeWeights, "_merged", no_room)
    ids, mask = prompts()
    model = policy_models("shared")[0][1]()
    lines = []
    engine = Engine(check_every=4, log=lines.append)
    for _ in range(2):
        assert engine.load(model, torch.float32)
        got = engine.decode(model, ids, mask, None, max_new_tokens=8, eos=-1, pad=0, sampler=Sampler("greedy"))
    assert engine.lora == "unmerged" and engine.weights.copy_bytes() == 0
    assert got.tokens == decode(model, ids, mask, None, max_new_tokens=8, eos=-1, pad=0, choose=greedy_chooser())
    assert lines == ["rollout: adapters unmerged in the decode step: the merged copy of the weights does not fit on cpu"]
