"""Named model shapes. Weights are random: the Sarathi results depend on shapes, not on weights."""
from __future__ import annotations

from transformers import LlamaConfig, MistralConfig, PretrainedConfig


def _llama(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, context: int = 4096,
           vocab: int = 32000, config=LlamaConfig, **extra) -> PretrainedConfig:
    return config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=context, **extra)


PRESETS: dict[str, PretrainedConfig] = {
    # A few M parameters: unit and end-to-end tests.
    "tiny": _llama(256, 688, 4, 4, 2, context=2048, vocab=4096),
    # ~110M parameters: on a CPU a decode token costs several times a prefill token, as on a GPU;
    # multi-head attention like LLaMA-13B, the paper's main model.
    "cpu-small": _llama(768, 2048, 12, 12, 12, tie_word_embeddings=True),
    # The papers' shapes (LLaMA-2 context, so that the 1K-3K sweeps fit).
    "llama2-7b": _llama(4096, 11008, 32, 32, 32),
    "llama-13b": _llama(5120, 13824, 40, 40, 40),
    "llama-33b": _llama(6656, 17920, 60, 52, 52),
    "mistral-7b": _llama(4096, 14336, 32, 32, 8, context=32768, config=MistralConfig, sliding_window=None,
                         rope_theta=1e6),
    # Sarathi-Serve's second model (two A100s, tensor parallel): 01-ai/Yi-34B's config.json.
    "yi-34b": _llama(7168, 20480, 60, 56, 8, vocab=64000, rope_theta=5e6),
}
for _cfg in PRESETS.values():
    _cfg.architectures = [_cfg.__class__.__name__.replace("Config", "ForCausalLM")]
