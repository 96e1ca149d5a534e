"""Paged attention in PyTorch: the CPU path, and the reference the Triton kernels are held to.

Prefill chunks run one request at a time (few, long, compute-bound) through
``scaled_dot_product_attention`` over the request's context gathered from its cache blocks. On the
CPU in float32, decodes (many, one query each, memory-bound) run in one call of the C++ paged-decode
kernel (``sarathi_kernels.cpu_decode``), which reads each cached row once, in place. Elsewhere, or
when that kernel cannot be built, they run as a few padded batches of similar context lengths
through ``scaled_dot_product_attention``, as follows.

Performance notes (CPU, measured on cpu-small, see benchmarks/RESULTS.md):
- The gathered context goes into one workspace that is reused by every layer and iteration. A fresh
  allocation per layer cost more than the copy itself: tens of MB freshly mapped per layer, page
  faulted on first touch.
- Decodes are padded only within groups of similar context lengths, so a short request does not
  copy and attend over the padding of the longest one.
- A decode's runs of consecutive cache blocks (a prompt's blocks are allocated together, so its
  prefix is usually one run) of at least ``_MIN_RUN`` blocks are attended in place, as views of
  the cache, without a copy; only the short runs (blocks added one at a time while decoding) are
  gathered. The partial results are merged by their log-sum-exp (CPU only: it needs the CPU flash
  kernel's log-sum-exp; elsewhere everything is gathered).
- The decode plan (groups, runs, gather indices, masks) is built once per iteration and shared by
  all layers: they see the same ``AttentionMetadata`` object.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sarathi_kernels import cpu_decode
from sarathi_lab.attention.backend import AttentionBackend, register_backend
from sarathi_lab.attention.metadata import AttentionMetadata

# A decode joins the current group while its context needs at least this share of the group's
# longest context: at most 1 - share of a group's gathered rows are padding.
_GROUP_SHARE = 0.7
# Runs of at least this many consecutive blocks are read in place instead of gathered: below it
# the per-call cost of a separate attention call exceeds the copy it saves (measured on cpu-small).
_MIN_RUN = 8


def gather_context(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[R, max_blocks] block ids -> [R, kv_heads, max_blocks * block_size, head_dim] cache rows."""
    r, nb = block_tables.shape
    _, bs, kvh, d = cache.shape
    rows = cache.index_select(0, block_tables.reshape(-1)).view(r, nb * bs, kvh, d)
    return rows.transpose(1, 2)


@dataclass
class _DecodeGroup:
    rows: torch.Tensor | None  # decode indices (into the decodes) of this group; None: all, in order
    blocks: torch.Tensor  # int64 [n * nblocks]: the group's block tables, flattened
    n: int
    nblocks: int
    ctx: int  # keys attended: the longest context when masked, the common one otherwise
    # [n, 1, 1, nblocks * block_size], True/0 where a key is attended (bool for F.sdpa, additive
    # float for the flash op); None if all contexts are equal.
    mask: torch.Tensor | None


@dataclass
class _DecodePlan:
    groups: list[_DecodeGroup]  # the gathered parts
    runs: list[tuple[int, int, int]]  # parts read in place: (decode index, first block, tokens)
    # Decode index of every part, groups' rows first, then runs; None when nothing is in place.
    owners: torch.Tensor | None = None
    single: bool = True  # every decode has exactly one part: no merge needed


@register_backend("torch")
class TorchAttention(AttentionBackend):
    def __init__(self, cpu_kernel: bool = True):
        # False: always the sdpa decode path below (tests hold the two against each other).
        self.cpu_kernel = cpu_kernel
        self._workspace: torch.Tensor | None = None
        self._plan_meta: AttentionMetadata | None = None
        self._plan_block_size = 0
        self._plan_kernel = False  # this iteration's decodes run in the C++ kernel
        self._plan = _DecodePlan([], [])
        self._prefill_masks: dict[tuple[int, int], torch.Tensor] = {}

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        kvh, d = k_cache.shape[2:]
        k_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, key)
        v_cache.view(-1, kvh, d).index_copy_(0, meta.slot_mapping, value)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if meta is not self._plan_meta or k_cache.shape[1] != self._plan_block_size:
            # Every layer sees the same dtype, device and cache layout: decide once per iteration.
            self._plan_kernel = meta.num_decodes > 0 and self._kernel_decodes(query, k_cache)
            self._new_iteration(meta, k_cache.shape[1], query.device, plan_decodes=not self._plan_kernel)
        out = torch.empty_like(query)
        start = 0
        for i in range(meta.num_prefills):
            q_len, ctx = meta.query_lens_host[i], meta.seq_lens_host[i]
            nblocks = -(-ctx // k_cache.shape[1])
            k, v = self._gather(k_cache, v_cache, meta.block_tables[i, :nblocks], 1, nblocks)
            k, v = k[:, :, :ctx], v[:, :, :ctx]
            q = query[start : start + q_len].transpose(0, 1).unsqueeze(0)
            if q_len == ctx:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
            else:
                # Causal aligned bottom-right: query row r sits at position ctx - q_len + r.
                mask = self._prefill_masks.get((q_len, ctx))
                if mask is None:
                    mask = self._prefill_masks[(q_len, ctx)] = causal_lower_right(q_len, ctx, query.device)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
            out[start : start + q_len] = o[0].transpose(0, 1)
            start += q_len
        if self._plan_kernel:
            p = meta.num_prefills
            out[start:] = cpu_decode.paged_decode(query[start:], k_cache, v_cache, meta.block_tables[p:],
                                                  meta.seq_lens[p:], scale)
        elif meta.num_decodes:
            self._decode(query[start:], out[start:], k_cache, v_cache, scale)
        return out

    def _kernel_decodes(self, query, k_cache) -> bool:
        return (self.cpu_kernel and query.device.type == "cpu" and query.dtype == torch.float32
                and k_cache.is_contiguous() and cpu_decode.available())

    def _decode(self, query, out, k_cache, v_cache, scale: float) -> None:
        plan = self._plan
        if not plan.runs:
            for g in plan.groups:
                q = query if g.rows is None else query.index_select(0, g.rows)
                k, v = self._gather(k_cache, v_cache, g.blocks, g.n, g.nblocks)
                if g.mask is None:
                    k, v = k[:, :, : g.ctx], v[:, :, : g.ctx]
                o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=g.mask, scale=scale,
                                                   enable_gqa=True).squeeze(2)
                if g.rows is None:
                    out.copy_(o)
                else:
                    out.index_copy_(0, g.rows, o)
            return
        # Parts with their log-sum-exp, merged below. Grouped-query heads ride as query rows:
        # [n, kv_heads, heads / kv_heads, d] against [n, kv_heads, keys, d].
        n, heads, d = query.shape
        _, bs, kvh, _ = k_cache.shape
        outs, lses = [], []
        for g in plan.groups:
            q = query if g.rows is None else query.index_select(0, g.rows)
            k, v = self._gather(k_cache, v_cache, g.blocks, g.n, g.nblocks)
            if g.mask is None:
                k, v = k[:, :, : g.ctx], v[:, :, : g.ctx]
            o, lse = _flash(q.reshape(g.n, kvh, heads // kvh, d), k, v, g.mask, scale)
            outs.append(o.reshape(g.n, heads, d))
            lses.append(lse.reshape(g.n, heads))
        for i, b0, tokens in plan.runs:
            nblk = -(-tokens // bs)
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

    def _gather(self, k_cache, v_cache, blocks: torch.Tensor, n: int, nblocks: int):
        """Keys and values of ``n`` requests' ``nblocks`` blocks each, as [n, kv_heads, nblocks * bs, d]
        views of the workspace."""
        _, bs, kvh, d = k_cache.shape
        numel = n * nblocks * bs * kvh * d
        ws = self._workspace
        if ws is None or ws.numel() < 2 * numel or ws.dtype != k_cache.dtype or ws.device != k_cache.device:
            # Zero-filled so that every page is mapped once, here, and not on each layer's first touch.
            self._workspace = ws = torch.zeros(2 * numel + numel // 4, dtype=k_cache.dtype, device=k_cache.device)
        blocks = blocks.reshape(-1)
        k = torch.index_select(k_cache, 0, blocks, out=ws[:numel].view(n * nblocks, bs, kvh, d))
        v = torch.index_select(v_cache, 0, blocks, out=ws[numel : 2 * numel].view(n * nblocks, bs, kvh, d))
        return (k.view(n, nblocks * bs, kvh, d).transpose(1, 2), v.view(n, nblocks * bs, kvh, d).transpose(1, 2))

    def _new_iteration(self, meta: AttentionMetadata, block_size: int, device: torch.device,
                       plan_decodes: bool) -> None:
        """Split the decodes' contexts into runs read in place and blocks gathered, group the
        gathered parts by length, and build what every layer reuses."""
        self._plan_meta, self._plan_block_size = meta, block_size
        self._prefill_masks = {}
        self._plan = _DecodePlan([], [])
        p, n = meta.num_prefills, meta.num_decodes
        if not n or not plan_decodes:
            return
        lens = meta.seq_lens_host[p:]
        in_place = device.type == "cpu"
        runs: list[tuple[int, int, int]] = []
        rest: dict[int, tuple[list[int], int]] = {}  # decode index -> (gathered blocks, their tokens)
        if in_place:
            for i, table in enumerate(meta.block_tables[p:].tolist()):
                ctx = lens[i]
                nb = -(-ctx // block_size)
                blocks, tokens, j = [], 0, 0
                while j < nb:
                    k = j
                    while k + 1 < nb and table[k + 1] == table[k] + 1:
                        k += 1
                    run_tokens = min(ctx, (k + 1) * block_size) - j * block_size
                    if k + 1 - j >= _MIN_RUN:
                        runs.append((i, table[j], run_tokens))
                    else:
                        blocks += table[j : k + 1]
                        tokens += run_tokens
                    j = k + 1
                if blocks:
                    rest[i] = (blocks, tokens)
        if not runs:
            self._plan.groups, _ = self._groups(meta, list(range(n)), None, block_size, device, additive=False)
            return
        groups, members = self._groups(meta, sorted(rest), rest, block_size, device, additive=True)
        owners = [i for rows in members for i in rows] + [i for i, _, _ in runs]
        self._plan = _DecodePlan(groups, runs, torch.tensor(owners, dtype=torch.long, device=device),
                                 single=len(owners) == n)

    @staticmethod
    def _groups(meta: AttentionMetadata, rows: list[int], rest, block_size: int, device,
                additive: bool) -> tuple[list[_DecodeGroup], list[list[int]]]:
        """Padded gather groups of decodes with similar lengths, and each group's decode indices.
        ``rest``: per decode, the blocks and tokens to gather, when not its whole table."""
        if not rows:
            return [], []
        p = meta.num_prefills
        all_lens = meta.seq_lens_host[p:]
        length = (lambda i: all_lens[i]) if rest is None else (lambda i: rest[i][1])
        order = sorted(rows, key=lambda i: -length(i))
        grouped, current = [], [order[0]]
        for i in order[1:]:
            if length(i) >= _GROUP_SHARE * length(current[0]):
                current.append(i)
            else:
                grouped.append(current)
                current = [i]
        grouped.append(current)
        groups, group_members = [], []
        whole = rest is None and len(grouped) == 1
        for members in grouped:
            if whole:
                members = rows
            ctx = max(length(i) for i in members)
            nblocks = -(-ctx // block_size)
            idx = None if whole else torch.tensor(members, dtype=torch.long, device=device)
            if rest is None:
                tables = meta.block_tables[p:]
                table = tables[:, :nblocks] if whole else tables.index_select(0, idx)[:, :nblocks]
                table = table.reshape(-1).to(torch.long)
            else:
                table = torch.tensor([rest[i][0] + [0] * (nblocks - len(rest[i][0])) for i in members],
                                     dtype=torch.long, device=device).reshape(-1)
            mask = None
            if any(length(i) != ctx for i in members):
                keys = torch.arange(nblocks * block_size, device=device)
                member_lens = torch.tensor([length(i) for i in members], device=device)
                mask = (keys[None, :] < member_lens[:, None])[:, None, None, :]
                if additive:
                    mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, float("-inf"))
            groups.append(_DecodeGroup(idx, table, len(members), nblocks, ctx, mask))
            group_members.append(members)
        return groups, group_members


def _flash(q, k, v, mask, scale):
    """Attention and its log-sum-exp per query row, from the CPU flash kernel."""
    if mask is not None:
        mask = mask.to(q.dtype)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                       scale=scale)


def causal_lower_right(q_len: int, ctx: int, device: torch.device) -> torch.Tensor:
    rows = torch.arange(q_len, device=device)[:, None] + (ctx - q_len)
    return torch.arange(ctx, device=device)[None, :] <= rows
