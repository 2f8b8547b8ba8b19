"""Tiny Qwen3-architecture causal LMs with a character-level tokenizer, built locally (the CPU scales)."""

from __future__ import annotations

import string

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
# Printable ASCII without the three exotic whitespace characters.
CHARACTERS = tuple(c for c in string.printable if c not in "\r\x0b\x0c")


def build_char_tokenizer():
    """A fast tokenizer that maps every character to one token (left-padded for generation)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters back without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",
    )


def build_tiny_model(scale, tokenizer, seed: int):
    """A freshly initialised Qwen3ForCausalLM sized by a ``TinyScale`` config."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=scale.hidden_size,
        intermediate_size=scale.intermediate_size,
        num_hidden_layers=scale.num_layers,
        num_attention_heads=scale.num_heads,
        num_key_value_heads=scale.num_kv_heads,
        head_dim=scale.hidden_size // scale.num_heads,
        max_position_embeddings=scale.max_length,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)
