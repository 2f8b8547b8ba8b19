"""Random chat models for tests of chat-style jobs: a tiny Qwen3 with random weights, the
character tokenizer and a chat template, saved as an ordinary model folder (``kind: hf``)."""

from __future__ import annotations

from pathlib import Path

# The usual shape of a chat template (role markers, a generation prompt).
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def random_chat_model(folder: Path, seed: int, hidden_size: int = 32, layers: int = 1, logit_scale: float = 1.0) -> Path:
    """A model folder whose weights are drawn with ``seed`` (two seeds: two different models).

    ``logit_scale`` multiplies the output layer: above 1 the logits spread as a trained
    model's do (a few units) rather than a random initialisation's near-uniform ones."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from matrixrl.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    heads = max(2, hidden_size // 32)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=hidden_size // heads,
        max_position_embeddings=8192, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def stand_in_tokenizer(vocab_size: int):
    """A tokenizer of exactly ``vocab_size`` tokens with a chat template, built here (nothing
    downloaded): the character tokenizer's special tokens and characters (every character one
    token, so a text of n characters is n tokens), then filler tokens ``<|t{id}|>`` up to the
    size, which text never produces but a model may sample (they decode to their names).
    What a random model of a real vocabulary (Qwen3's 151,936) loads as its tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from matrixrl.models.tiny import CHARACTERS, SPECIAL_TOKENS

    base = SPECIAL_TOKENS + CHARACTERS
    if vocab_size < len(base):
        raise ValueError(f"a stand-in tokenizer needs at least {len(base)} tokens, not {vocab_size}")
    vocab = {token: i for i, token in enumerate(base)}
    vocab.update({f"<|t{i}|>": i for i in range(len(base), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>",
        padding_side="left",
    )  # fmt: skip
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def random_shaped_model(folder: Path, fields: dict, seed: int = 0, dtype: str = "bfloat16", device: str = "cpu") -> Path:
    """A Qwen3 of the architecture ``fields`` (config.json's: hidden_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
    tie_word_embeddings) with random weights drawn with ``seed`` on ``device``, saved in
    ``dtype`` (a real checkpoint's bfloat16 by default) beside :func:`stand_in_tokenizer` of
    its vocabulary: a model folder an ``hf`` scale loads as it loads a real one."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = stand_in_tokenizer(int(fields["vocab_size"]))
    keys = (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "tie_word_embeddings",
    )  # fmt: skip
    config = Qwen3Config(
        **{key: fields[key] for key in keys}, max_position_embeddings=40960, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    return folder
