"""Generation as the trainer and the evaluation see it: what is scored is what is trained,
keyed evaluation samples are reproducible and follow the model's distribution, and an
evaluation's accuracy, standard error and pass@k are computed as documented."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from matrixrl.config import TinyScale
from matrixrl.jobs.evaluate import pass_at
from matrixrl.models.tiny import build_char_tokenizer, build_tiny_model
from matrixrl.tasks import build_task
from matrixrl.tasks.arith import Settings as ArithSettings
from matrixrl.tasks.base import Problem
from matrixrl.train.grpo import TurnBatch
from matrixrl.train.rollout import make_generate
from matrixrl.train.samplers import keyed_uniform
from matrixrl.workflows.base import Turn

TINY = TinyScale(kind="tiny", hidden_size=32, num_layers=1, intermediate_size=64, num_heads=2, num_kv_heads=1)


class OnePolicy:
    """The one model every role plays (what make_generate needs of a policy)."""

    def __init__(self, model):
        self.model = model

    def model_for(self, role):
        return self.model


def scripted(tokenizer, continuation: list[int]):
    """A tiny model whose i-th forward pass puts all the probability on ``continuation[i]``,
    whatever the prompt: greedy decoding follows the script."""
    model = build_tiny_model(TINY, tokenizer, seed=0)
    forward, passes = model.forward, []

    @functools.wraps(forward)
    def scripted_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits = torch.full_like(out.logits, -1e4)
        out.logits[..., continuation[len(passes)]] = 0.0
        passes.append(1)
        return out

    model.forward = scripted_forward
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_a_pad_sampled_mid_answer_is_in_the_scored_text_as_in_the_trained_tokens(tokenizer) -> None:
    two, one = tokenizer.convert_tokens_to_ids(["2", "1"])
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    generate = make_generate(OnePolicy(scripted(tokenizer, [two, pad, one, eos, pad])), tokenizer, max_new_tokens=5, temperature=1.0, sample=False)
    (completion,) = generate("generator", ["4+8+9="])
    # Trained on: up to and including the EOS (what follows is generate's padding).
    assert completion.completion_ids == [two, pad, one, eos]
    batch = TurnBatch.from_turns([Turn("generator", "generator0", 0, "4+8+9=", completion, advantage=1.0)], pad)
    assert batch.completion_ids[0].tolist() == [two, pad, one, eos] and batch.completion_mask[0].tolist() == [1.0] * 4
    # Scored on: the same tokens, the pad included; "21" alone would be right.
    assert completion.text == "2<pad>1"
    task = build_task("arith", ArithSettings(kind="arith", digits=1, terms=3))
    problem = Problem("p", "4+8+9", "21")
    assert task.score_batch([problem, problem], [completion.text, "21"]) == [0.0, 1.0]


def test_every_sampled_completion_is_the_decoding_of_its_trained_tokens(tokenizer) -> None:
    model = build_tiny_model(TINY, tokenizer, seed=0)  # untrained: it samples special tokens too
    policy = OnePolicy(model)
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    train = make_generate(policy, tokenizer, max_new_tokens=8, temperature=1.0, sample=True)
    keyed = make_generate(policy, tokenizer, max_new_tokens=8, temperature=0.7, sample=True, seed=3)
    completions = train("generator", ["1+2="] * 64) + keyed("generator", ["1+2="] * 64)
    specials = 0
    for c in completions:
        answered = c.completion_ids[:-1] if c.completion_ids[-1:] == [eos] else c.completion_ids
        assert c.text == tokenizer.decode(answered, skip_special_tokens=False)
        specials += any(t in tokenizer.all_special_ids for t in answered)
    assert specials > 0, "an untrained model should sample some special tokens mid-answer"


def test_keyed_samples_repeat_and_do_not_depend_on_batch_size_or_global_rng(tokenizer) -> None:
    policy = OnePolicy(build_tiny_model(TINY, tokenizer, seed=1))
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(4)]

    def draw(batch_size: int, seed: int = 7) -> list[list[int]]:
        generate = make_generate(policy, tokenizer, max_new_tokens=6, temperature=0.7, sample=True, seed=seed, batch_size=batch_size)
        return [c.completion_ids for c in generate("generator", prompts)]

    torch.manual_seed(0)
    whole = draw(256)
    torch.manual_seed(123)  # the global generator plays no part
    assert draw(256) == whole
    assert draw(7) == whole  # nor the batch size
    assert draw(256, seed=8) != whole  # another key, other samples
    # Rows are keyed by their place, not their text: k copies of a prompt are k samples.
    copies = make_generate(policy, tokenizer, max_new_tokens=6, temperature=0.7, sample=True, seed=7)("generator", ["1+2="] * 8)
    assert len({tuple(c.completion_ids) for c in copies}) > 1


def test_keyed_sampling_follows_the_softmax_at_the_temperature() -> None:
    from matrixrl.train.samplers import KeyedSampler

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    temperature = 0.7
    rows = 20_000
    sampler = KeyedSampler(temperature, torch.arange(rows, dtype=torch.int64) * 7919)
    picks = sampler(None, logits.repeat(rows, 1)).argmax(dim=-1)
    frequencies = torch.bincount(picks, minlength=4).double() / rows
    expected = torch.softmax(logits.double() / temperature, dim=0)
    # Binomial SE of each frequency is at most 0.0036 here; 4 SEs.
    assert torch.allclose(frequencies, expected, atol=0.015), (frequencies, expected)
    noise = keyed_uniform(torch.arange(1000, dtype=torch.int64), 0, 50)
    assert 0.0 < noise.min() and noise.max() < 1.0 and abs(noise.mean().item() - 0.5) < 0.01


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    # 4 samples per problem; correct counts 0, 1, 2, 4.
    correct = np.array([0, 1, 2, 4])
    got = pass_at(correct, 4)
    assert list(got) == ["1", "2", "4"]
    assert got["1"] == pytest.approx(np.mean([0, 1 / 4, 2 / 4, 1]))
    # pass@2 = 1 - C(k-c, 2) / C(k, 2) with C(4, 2) = 6: c=1 → 1 - 3/6, c=2 → 1 - 1/6.
    assert got["2"] == pytest.approx(np.mean([0, 0.5, 5 / 6, 1]))
    assert got["4"] == pytest.approx(0.75)  # any of the four right
    assert list(pass_at(np.array([1, 0, 1]), 1)) == ["1"] and list(pass_at(np.array([3]), 3)) == ["1", "2", "3"]


def test_the_evaluation_standard_error_is_that_of_per_problem_means() -> None:
    from matrixrl.analysis.curves import summarize_curve
    from matrixrl.config import Analysis

    rule = Analysis(cliff_delta=0.10, cliff_noise_se=2.0)
    # Binomial SEs at n=100: peak 0.7 → 0.0458, final 0.5 → 0.05: drop 0.2 > 2·0.0678.
    assert summarize_curve([0, 10, 20], [0.3, 0.7, 0.5], 100, rule).cliff is True
    # The same accuracies with the SEs of k samples whose per-problem means vary more: not beyond noise.
    assert summarize_curve([0, 10, 20], [0.3, 0.7, 0.5], 100, rule, se=[0.05, 0.08, 0.08]).cliff is False
    # A missing SE (a file from before SEs were stored) falls back to the binomial one.
    assert summarize_curve([0, 10, 20], [0.3, 0.7, 0.5], 100, rule, se=[None, float("nan"), None]).cliff is True


def test_eval_seeds_differ_per_checkpoint_and_from_training_steps() -> None:
    from matrixrl.jobs.evaluate import eval_seed
    from matrixrl.train.trainer import step_seed

    seeds = {eval_seed(0, step) for step in range(0, 100, 10)} | {eval_seed(1, 0)}
    assert len(seeds) == 11
    assert eval_seed(0, 10) == eval_seed(0, 10)
    assert not seeds & {step_seed(0, s) for s in range(100)}
    assert math.isfinite(eval_seed(0, 0))


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_repeated_prompts_encoded_once_give_what_encoding_every_row_gives(tokenizer, monkeypatch, adapter) -> None:
    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy
    from matrixrl.train import prompt_cache

    policy = build_policy("isolated", build_tiny_model(TINY, tokenizer, seed=2), ("generator", "aggregator"), Policies(adapter=adapter))
    prompts = ["1+2=", "12+34=", "7="] * 5 + ["9+9+9="]  # repeats of unequal length, and one prompt alone

    def draw() -> list[list[int]]:
        keyed = make_generate(policy, tokenizer, max_new_tokens=6, temperature=0.7, sample=True, seed=5)
        greedy = make_generate(policy, tokenizer, max_new_tokens=6, temperature=1.0, sample=False)
        return [c.completion_ids for g in (keyed, greedy) for c in g("generator", prompts)]

    assert prompt_cache.prefilled_cache(policy.model_for("generator"), tokenizer, prompts, "cpu") is not None
    shared = draw()
    monkeypatch.setattr(prompt_cache, "prefilled_cache", lambda *args: None)
    assert draw() == shared


# Prompts sharing a 40-character prefix (a chat template's system message, in miniature),
# remainders of unequal length, repeats, and one remainder of a single token.
LONG_PREFIX = [f"Add the numbers and answer with digits. {a}+{b}=" for a in range(6) for b in (3, 45, 678)] * 2 + [
    "Add the numbers and answer with digits. ="
]


# Two levels: instructions common to the call, then a long problem common to a group's
# prompts (a judge's or an aggregator's), then each candidate; one prompt shares only the
# instructions, one is all instructions.
PROBLEMS = ["Tom has 3 apples and buys 4 more; how many? ", "A box holds 12 pens; 5 are taken; left? "]
NESTED = [f"Judge the answer to the problem below. {q}{c}" for q in PROBLEMS for c in ("7", "12", "6+1=7", "7")] + [
    "Judge the answer to the problem below. 1+1=",
    "Judge the answer to the problem below.",
]


def test_prompts_tokenized_once_are_the_tokenizers_padded_batch(tokenizer) -> None:
    """``tokenize_prompts`` tokenizes each distinct prompt once: its ids and mask are what the
    tokenizer's own left-padded batch holds, repeats, unequal lengths and an empty prompt included."""
    from matrixrl.train.prompt_cache import tokenize_prompts

    for prompts in (LONG_PREFIX, NESTED + [""] + NESTED[:3], ["1+2="] * 4, [""] * 2):
        expected = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        got = tokenize_prompts(tokenizer, prompts)
        assert torch.equal(got.input_ids, expected["input_ids"]) and torch.equal(got.attention_mask, expected["attention_mask"])


def test_prefix_levels_split_shared_prefixes_of_at_least_the_minimum() -> None:
    from matrixrl.train.prompt_cache import _prefix_levels

    bodies = [list(range(40)) + list(range(100, 140)) + [k] for k in range(3)] + [list(range(40)) + [7, 8]]
    levels = _prefix_levels(bodies, minimum=32)
    assert [len(level) for level in levels] == [1, 2, 4]
    assert levels[0] == [(0, list(range(40)))]
    assert levels[1] == [(0, list(range(100, 140))), (0, [])]  # the short body shares nothing more
    assert levels[2] == [(0, [0]), (0, [1]), (0, [2]), (1, [7, 8])]
    # The three that share 80 tokens share them in one node when 41 is the minimum.
    assert _prefix_levels(bodies, minimum=41)[0] == [(0, list(range(40)) + list(range(100, 140))), (0, [])]
    # Below the minimum nothing is shared: one level, each body whole.
    assert _prefix_levels(bodies, minimum=81) == [[(0, b) for b in bodies]]


@pytest.mark.parametrize("prompts", [LONG_PREFIX, NESTED], ids=["one level", "nested"])
def test_long_shared_prefixes_encoded_once_give_what_each_prompt_alone_gives(tokenizer, monkeypatch, prompts) -> None:
    from matrixrl.train import prompt_cache

    model = build_tiny_model(TINY, tokenizer, seed=4)
    passes: list[int] = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: passes.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    prefill = prompt_cache.prefilled_cache(model, tokenizer, prompts, "cpu")
    hook.remove()
    # One pass per level, over that level's distinct segments.
    assert passes == ([1, len(set(prompts))] if prompts is LONG_PREFIX else [1, 4, len(set(prompts))])  # 2 problems, 2 alone
    assert prefill is not None and bool((prefill.mask.cummax(-1).values > prefill.mask).any())  # padding inside rows
    layout_rows = [row[mask.bool()].tolist() for row, mask in zip(prefill.ids, prefill.mask)]
    assert layout_rows == [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    # The next token's logits of every row, from the shared cache and from the prompt encoded alone.
    positions = (prefill.mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        shared = model(
            input_ids=prefill.ids[:, -1:], attention_mask=prefill.mask, position_ids=positions[:, -1:], cache=prefill.cache
        ).logits[:, -1]
        alone = torch.cat([model(**tokenizer(p, return_tensors="pt", add_special_tokens=False)).logits[:, -1] for p in prompts])
    torch.testing.assert_close(shared, alone, rtol=1e-5, atol=1e-5)

    def draw() -> list[list[int]]:
        greedy = make_generate(OnePolicy(model), tokenizer, max_new_tokens=6, temperature=1.0, sample=False)
        return [c.completion_ids for c in greedy("generator", prompts)]

    shared_tokens = draw()
    monkeypatch.setattr(prompt_cache, "prefilled_cache", lambda *args: None)
    assert draw() == shared_tokens


def stopping_at(model, eos: int, every: int):
    """``model`` with EOS (all but) certain as the next token of a position that is a
    multiple of ``every``: rows of prompts of other lengths stop at other steps."""
    forward = model.forward

    @functools.wraps(forward)  # generate reads the signature (position_ids, logits_to_keep)
    def stopping_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        at = kwargs["position_ids"][:, -1] % every == 0
        out.logits[at, -1, eos] = out.logits[at, -1].max(dim=-1).values + 50.0
        return out

    model.forward = stopping_forward
    return model


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_decoding_gives_the_tokens_of_transformers_generate_while_finished_rows_leave_the_batch(tokenizer, adapter) -> None:
    from matrixrl.config import Policies
    from matrixrl.models.policies import build_policy

    policy = build_policy("shared", build_tiny_model(TINY, tokenizer, seed=0), ("generator",), Policies(adapter=adapter))
    model = policy.model_for("generator")
    model = model.get_base_model() if adapter == "lora" else model  # the causal LM under the adapters
    stopping_at(model, tokenizer.eos_token_id, every=5)
    batches: list[int] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    # Prompts of 4 to 7 tokens (padding; the unpadded rows of 7 stop last), repeats (the
    # shared prompt cache), a batch with no padding at all, and prompts with a long
    # shared prefixes (encoded once, the rows laid out as each level's padded segment).
    calls = [[f"{a}+{b}=" for a in range(12) for b in (3, 45, 678)] + ["1+2="] * 6, ["4+8+9="] * 8, LONG_PREFIX, NESTED * 2]
    for sampling in (dict(sample=False, temperature=1.0), dict(sample=True, temperature=0.7), dict(sample=True, temperature=0.7, seed=3)):
        for prompts in calls:
            got = {}
            for reference in (True, False):
                generate = make_generate(policy, tokenizer, max_new_tokens=9, use_hf_generate=reference, **sampling)
                torch.manual_seed(11)
                batches.clear()
                got[reference] = (generate("generator", prompts), list(batches), torch.rand(1))
            (expected, hf_batches, hf_after), (completions, batches_seen, after) = got[True], got[False]
            assert [c.completion_ids for c in completions] == [c.completion_ids for c in expected], sampling
            assert [c.text for c in completions] == [c.text for c in expected]
            assert [c.entropy_sum for c in completions] == pytest.approx([c.entropy_sum for c in expected], rel=1e-6)
            assert torch.equal(after, hf_after), "torch's generator must advance as under generate"
            lengths = {len(c.completion_ids) for c in completions}
            if len(prompts) > 8:
                assert len(lengths) > 1 and min(lengths) < 9
                # After the shared prompts' prefill (two calls: the prefix, then the
                # remainders), generate computes every row at every step; here finished rows left the batch.
                prefill_calls = {len(LONG_PREFIX): 2, 2 * len(NESTED): 3}.get(len(prompts), 1)
                assert set(hf_batches[prefill_calls:]) == {len(prompts)} and batches_seen[-1] < len(prompts)
