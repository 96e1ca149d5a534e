"""Paged attention in PyTorch, the CPU path (attention/reference.py is the plain version): on the
CPU C++ kernels read keys and values in place; elsewhere sdpa over gathered contexts, decodes laid
out by ``decode_plan`` (docs/cpu_engine.md)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from sarathi_kernels import cpu_attention

from sarathi_lab.attention.backend import AttentionBackend, register_backend
from sarathi_lab.attention.decode_plan import DecodePlan, plan_decodes
from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.attention.reference import causal_lower_right, write_kv
from sarathi_lab.engine.block_manager import blocks_for


@dataclass
class TorchPlan:
    layout: tuple  # the caches' (block_size, dtype, device) it was planned for
    kernel: bool  # prefills and decodes run in the C++ kernels; otherwise sdpa, as below
    decodes: DecodePlan
    # Per prefill, its bottom-right causal mask for sdpa; None where the chunk is the whole context.
    prefill_masks: list[torch.Tensor | None]


@register_backend("torch")
class TorchAttention(AttentionBackend):

    def __init__(self, cpu_kernel: bool = True):
        # False: always the sdpa paths (tests hold the two against each other).
        self.cpu_kernel = cpu_kernel
        self._workspace: torch.Tensor | None = None
        # The kernels' plan depends on the cache alone: kept (weakly keyed) rather than rebuilt on a
        # host whose caches a forward pass has just flushed.
        self._kernel_plan: tuple[weakref.ref, TorchPlan] | None = None

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        if self._planned(meta, k_cache).kernel:
            cpu_attention.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        else:
            write_kv(key, value, k_cache, v_cache, meta.slot_mapping)

    def plan(self, meta: AttentionMetadata, k_cache: torch.Tensor) -> None:
        if self._kernel_plan is not None and self._kernel_plan[0]() is k_cache:
            meta.plan = self._kernel_plan[1]
            return
        device, block_size = k_cache.device, k_cache.shape[1]
        kernel = (self.cpu_kernel and device.type == "cpu" and k_cache.dtype in cpu_attention.DTYPES
                  and k_cache.is_contiguous() and cpu_attention.available())
        if kernel:
            meta.plan = TorchPlan(_layout(k_cache), True, DecodePlan([], []), [])
            self._kernel_plan = (weakref.ref(k_cache), meta.plan)
            return
        masks = [None if q_len == ctx else causal_lower_right(q_len, ctx, device)
                 for q_len, ctx in zip(meta.query_lens_host[: meta.num_prefills], meta.seq_lens_host)]
        meta.plan = TorchPlan(_layout(k_cache), False, plan_decodes(meta, block_size, device), masks)

    def _planned(self, meta: AttentionMetadata, k_cache: torch.Tensor) -> TorchPlan:
        # Callers outside the engine (benchmarks, tests) may skip planning.
        if not isinstance(meta.plan, TorchPlan) or meta.plan.layout != _layout(k_cache):
            self.plan(meta, k_cache)
        return meta.plan

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        plan = self._planned(meta, k_cache)
        out = torch.empty_like(query)
        if plan.kernel:
            p, start = meta.num_prefills, meta.num_prefill_tokens
            if p:
                cpu_attention.paged_prefill(query[:start], k_cache, v_cache, meta.block_tables[:p],
                                            meta.query_start_loc[: p + 1], meta.seq_lens[:p], scale, out=out[:start])
            if meta.num_decodes:
                cpu_attention.paged_decode(query[start:], k_cache, v_cache, meta.block_tables[p:], meta.seq_lens[p:],
                                           scale, out=out[start:])
            return out
        block_size = k_cache.shape[1]
        start = 0
        for i, mask in enumerate(plan.prefill_masks):
            q_len, ctx = meta.query_lens_host[i], meta.seq_lens_host[i]
            nblocks = blocks_for(ctx, block_size)
            k, v = self._gather(k_cache, v_cache, meta.block_tables[i, :nblocks], 1, nblocks)
            k, v = k[:, :, :ctx], v[:, :, :ctx]
            q = query[start : start + q_len].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                               enable_gqa=True)
            out[start : start + q_len] = o[0].transpose(0, 1)
            start += q_len
        if meta.num_decodes:
            self._decode(plan.decodes, query[start:], out[start:], k_cache, v_cache, scale)
        return out

    def _decode(self, plan: DecodePlan, query, out, k_cache, v_cache, scale: float) -> None:
        # Runs in place: parts with their log-sum-exp, merged below; GQA heads ride as query rows.
        n, heads, d = query.shape
        _, bs, kvh, _ = k_cache.shape
        outs, lses = [], []
        for g in plan.groups:
            q = query if g.rows is None else query.index_select(0, g.rows)
            k, v = self._gather(k_cache, v_cache, g.blocks, g.n, g.nblocks, g.pad)
            if g.mask is None:
                k, v = k[:, :, : g.ctx], v[:, :, : g.ctx]
            if plan.runs:
                o, lse = _flash(q.reshape(g.n, kvh, heads // kvh, d), k, v, g.mask, scale)
                outs.append(o.reshape(g.n, heads, d))
                lses.append(lse.reshape(g.n, heads))
                continue
            o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=g.mask, scale=scale,
                                               enable_gqa=True).squeeze(2)
            if g.rows is None:
                out.copy_(o)
            else:
                out.index_copy_(0, g.rows, o)
        if not plan.runs:
            return
        for i, b0, tokens in plan.runs:
            nblk = blocks_for(tokens, bs)
            k = k_cache[b0 : b0 + nblk].view(1, nblk * bs, kvh, d)[:, :tokens].transpose(1, 2)
            v = v_cache[b0 : b0 + nblk].view(1, nblk * bs, kvh, d)[:, :tokens].transpose(1, 2)
            o, lse = _flash(query[i].reshape(1, kvh, heads // kvh, d), k, v, None, scale)
            outs.append(o.reshape(1, heads, d))
            lses.append(lse.reshape(1, heads))
        o, lse = torch.cat(outs), torch.cat(lses)
        if plan.single:
            out.index_copy_(0, plan.owners, o.to(out.dtype))
            return
        owners, o = plan.owners, o.float()
        top = torch.full((n, heads), float("-inf"), dtype=lse.dtype, device=lse.device)
        top.scatter_reduce_(0, owners[:, None].expand(-1, heads), lse, "amax")
        w = torch.exp(lse - top.index_select(0, owners))
        num = torch.zeros((n, heads, d), dtype=o.dtype, device=o.device).index_add_(0, owners, o * w[..., None])
        den = torch.zeros((n, heads), dtype=w.dtype, device=w.device).index_add_(0, owners, w)
        out.copy_(num / den[..., None])

    def _gather(self, k_cache, v_cache, blocks: torch.Tensor, n: int, nblocks: int,
                pad: torch.Tensor | None = None):
        """``n`` requests' blocks as [n, kv_heads, keys, d] workspace views, 0 at ``pad``."""
        _, bs, kvh, d = k_cache.shape
        numel = n * nblocks * bs * kvh * d
        ws = self._workspace
        if ws is None or ws.numel() < 2 * numel or ws.dtype != k_cache.dtype or ws.device != k_cache.device:
            # Zero-filled: every page mapped once, here, not on each layer's first touch.
            self._workspace = ws = torch.zeros(2 * numel + numel // 4, dtype=k_cache.dtype, device=k_cache.device)
        blocks = blocks.reshape(-1)
        k = torch.index_select(k_cache, 0, blocks, out=ws[:numel].view(n * nblocks, bs, kvh, d))
        v = torch.index_select(v_cache, 0, blocks, out=ws[numel : 2 * numel].view(n * nblocks, bs, kvh, d))
        k, v = k.view(n, nblocks * bs, kvh, d).transpose(1, 2), v.view(n, nblocks * bs, kvh, d).transpose(1, 2)
        if pad is not None:
            # The copies, never the cache: padding keys score 0 (then masked) and add 0 x 0.
            k.masked_fill_(pad, 0)
            v.masked_fill_(pad, 0)
        return k, v


def _layout(k_cache: torch.Tensor) -> tuple:
    return k_cache.shape[1], k_cache.dtype, k_cache.device


def _flash(q, k, v, mask, scale):
    """Attention and its log-sum-exp per query row, from the CPU flash kernel."""
    if mask is not None:
        mask = mask.to(q.dtype)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                       scale=scale)
