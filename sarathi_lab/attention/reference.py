"""The attention every backend and kernel is held to: each request's context gathered from its cache
blocks, then PyTorch's causal sdpa aligned bottom-right. Plain and slow on purpose."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.engine.block_manager import blocks_for


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key/value [T, kv_heads, head_dim] into their flat cache slots (block * block_size + offset)."""
    kvh, d = k_cache.shape[2:]
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, value)


def causal_lower_right(q_len: int, ctx: int, device: torch.device) -> torch.Tensor:
    """[q_len, ctx] True where query row r (at position ctx - q_len + r) may see the key."""
    rows = torch.arange(q_len, device=device)[:, None] + (ctx - q_len)
    return torch.arange(ctx, device=device)[None, :] <= rows


def attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
              scale: float) -> torch.Tensor:
    """query [T, heads, head_dim] -> [T, heads, head_dim]; the cache already holds this step's keys."""
    out = torch.empty_like(query)
    block_size = k_cache.shape[1]
    start = 0
    for q_len, ctx, table in zip(meta.query_lens_host, meta.seq_lens_host, meta.block_tables):
        blocks = table[: blocks_for(ctx, block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:ctx].transpose(0, 1)  # [kv_heads, ctx, head_dim]
        v = v_cache[blocks].flatten(0, 1)[:ctx].transpose(0, 1)
        q = query[start : start + q_len].transpose(0, 1)  # [heads, q_len, head_dim]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, ctx, query.device),
                                           scale=scale, enable_gqa=True)
        out[start : start + q_len] = o.transpose(0, 1)
        start += q_len
    return out
