"""Random chat models for tests of chat-style jobs: a tiny Qwen3 with random weights, the
character tokenizer and a chat template, saved as an ordinary model folder (``kind: hf``)."""

from __future__ import annotations

from pathlib import Path

# The usual shape of a chat template (role markers, a generation prompt).
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def random_chat_model(folder: Path, seed: int) -> Path:
    """A model folder whose weights are drawn with ``seed`` (two seeds: two different models)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from matrixrl.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
