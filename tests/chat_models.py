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
