"""Paged attention in plain PyTorch: the CPU path, and the reference the Triton kernels are held to.

Prefill chunks run one request at a time (few, long, compute-bound); decodes run as one padded
batch (many, one query each, memory-bound), both through ``scaled_dot_product_attention``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sarathi_lab.attention.backend import AttentionBackend, register_backend
from sarathi_lab.attention.metadata import AttentionMetadata


def gather_context(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[R, max_blocks] block ids -> [R, kv_heads, max_blocks * block_size, head_dim] cache rows."""
    r, nb = block_tables.shape
    _, bs, kvh, d = cache.shape
    rows = cache.index_select(0, block_tables.reshape(-1)).view(r, nb * bs, kvh, d)
    return rows.transpose(1, 2)


@register_backend("torch")
class TorchAttention(AttentionBackend):
    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        kvh, d = k_cache.shape[2:]
        k_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, key)
        v_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, value)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        out = torch.empty_like(query)
        start = 0
        for i in range(meta.num_prefills):
            q_len, ctx = meta.query_lens_host[i], meta.seq_lens_host[i]
            nblocks = -(-ctx // k_cache.shape[1])
            table = meta.block_tables[i : i + 1, :nblocks]
            k = gather_context(k_cache, table)[:, :, :ctx]
            v = gather_context(v_cache, table)[:, :, :ctx]
            q = query[start : start + q_len].transpose(0, 1).unsqueeze(0)
            if q_len == ctx:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
            else:
                # Causal aligned bottom-right: query row r sits at position ctx - q_len + r.
                mask = causal_lower_right(q_len, ctx, query.device)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
            out[start : start + q_len] = o[0].transpose(0, 1)
            start += q_len
        if meta.num_decodes:
            out[start:] = self._decode(query[start:], k_cache, v_cache, meta, scale)
        return out

    @staticmethod
    def _decode(query, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        p = meta.num_prefills
        max_ctx = max(meta.seq_lens_host[p:])
        table = meta.block_tables[p:, : -(-max_ctx // k_cache.shape[1])]
        k = gather_context(k_cache, table)
        v = gather_context(v_cache, table)
        seq_lens = meta.seq_lens[p:].to(torch.long)
        mask = torch.arange(k.shape[2], device=query.device)[None, :] < seq_lens[:, None]
        q = query.unsqueeze(2)  # [D, heads, 1, head_dim]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale,
                                           enable_gqa=True)
        return o.squeeze(2)


def causal_lower_right(q_len: int, ctx: int, device: torch.device) -> torch.Tensor:
    rows = torch.arange(q_len, device=device)[:, None] + (ctx - q_len)
    return torch.arange(ctx, device=device)[None, :] <= rows
