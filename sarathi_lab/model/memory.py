"""What a model, its RoPE table and its KV cache take, by arithmetic on the model's config, so that a
size the machine cannot hold is refused before anything is allocated."""
from __future__ import annotations

# Building the cos/sin tables holds about four float32 [positions, head_dim] tensors at once
# (the frequencies, their concatenation, cos and sin; model/layers.py).
_ROPE_TENSORS = 4
_FLOAT32 = 4


def head_dim(hf) -> int:
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads


def context_limit(hf) -> int:
    """The longest request the model serves: its positions, or its sliding window (not implemented,
    so the context stops there)."""
    limit = hf.max_position_embeddings
    if getattr(hf, "sliding_window", None) and getattr(hf, "use_sliding_window", True):
        limit = min(limit, hf.sliding_window)
    return limit


def kv_block_bytes(hf, block_size: int, elem_bytes: int) -> int:
    kv_heads = hf.num_key_value_heads or hf.num_attention_heads
    return 2 * hf.num_hidden_layers * block_size * kv_heads * head_dim(hf) * elem_bytes


def weight_bytes(hf, elem_bytes: int, packed_linears: bool) -> int:
    """The parameters' bytes; oneDNN's packed copies double the linear layers (model/cpu_linear.py)."""
    hidden, heads, inter = hf.hidden_size, hf.num_attention_heads, hf.intermediate_size
    kv_heads, hd = hf.num_key_value_heads or heads, head_dim(hf)
    linear = hidden * hd * (2 * heads + 2 * kv_heads) + 3 * hidden * inter
    embed = hf.vocab_size * hidden
    lm_head = 0 if getattr(hf, "tie_word_embeddings", False) else hf.vocab_size * hidden
    linears = hf.num_hidden_layers * linear + lm_head
    return elem_bytes * (embed + linears * (2 if packed_linears else 1) + hf.num_hidden_layers * 2 * hidden)


def rope_table_bytes(hf, positions: int) -> int:
    return _ROPE_TENSORS * positions * head_dim(hf) * _FLOAT32
