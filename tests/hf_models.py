"""Small random Hugging Face models saved to disk, the reference the engine is held to."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

_SHAPE = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "eos_token_id": None, "bos_token_id": None, "pad_token_id": None}

CONFIGS = {
    "llama": lambda: LlamaConfig(**_SHAPE),
    "llama-rope-scaled": lambda: LlamaConfig(
        **_SHAPE, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "mistral": lambda: MistralConfig(**_SHAPE, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**_SHAPE),
    "llama-mha-tied": lambda: LlamaConfig(**(_SHAPE | {"num_key_value_heads": 4}), tie_word_embeddings=True),
}


def save_random_model(name: str, directory: Path, seed: int = 0):
    """Save a random model with ``save_pretrained`` (safetensors) and return the live HF model."""
    torch.manual_seed(seed)
    config = CONFIGS[name]()
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    # Random init gives near-uniform logits; a wider spread keeps greedy choices far from ties.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(directory, safe_serialization=True)
    return model


@torch.no_grad()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()
