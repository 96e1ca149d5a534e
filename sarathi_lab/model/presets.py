"""Named model shapes. Weights are random: the Sarathi results depend on shapes, not on weights."""
from __future__ import annotations

from transformers import LlamaConfig, MistralConfig, PretrainedConfig

_LLAMA_VOCAB = 32000

PRESETS: dict[str, PretrainedConfig] = {
    # A few M parameters: unit and end-to-end tests.
    "tiny": LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048),
    # ~110M parameters: on a CPU a decode token costs several times a prefill token, as on a GPU;
    # multi-head attention like LLaMA-13B, the paper's main model.
    "cpu-small": LlamaConfig(vocab_size=_LLAMA_VOCAB, hidden_size=768, intermediate_size=2048,
                             num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                             max_position_embeddings=4096, tie_word_embeddings=True),
    # The papers' shapes (LLaMA-2 context, so that the 1K-3K sweeps fit).
    "llama2-7b": LlamaConfig(vocab_size=_LLAMA_VOCAB, hidden_size=4096, intermediate_size=11008,
                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                             max_position_embeddings=4096),
    "llama-13b": LlamaConfig(vocab_size=_LLAMA_VOCAB, hidden_size=5120, intermediate_size=13824,
                             num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                             max_position_embeddings=4096),
    "llama-33b": LlamaConfig(vocab_size=_LLAMA_VOCAB, hidden_size=6656, intermediate_size=17920,
                             num_hidden_layers=60, num_attention_heads=52, num_key_value_heads=52,
                             max_position_embeddings=4096),
    "mistral-7b": MistralConfig(vocab_size=_LLAMA_VOCAB, hidden_size=4096, intermediate_size=14336,
                                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                max_position_embeddings=32768, sliding_window=None, rope_theta=1e6),
    # Sarathi-Serve's second model (two A100s, tensor parallel): 01-ai/Yi-34B's config.json.
    "yi-34b": LlamaConfig(vocab_size=64000, hidden_size=7168, intermediate_size=20480, num_hidden_layers=60,
                          num_attention_heads=56, num_key_value_heads=8, max_position_embeddings=4096,
                          rope_theta=5e6),
}
for _cfg in PRESETS.values():
    _cfg.architectures = [_cfg.__class__.__name__.replace("Config", "ForCausalLM")]
