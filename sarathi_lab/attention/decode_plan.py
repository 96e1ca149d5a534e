"""How the torch sdpa path reads decodes: block runs in place, the rest gathered by length."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from sarathi_lab.attention.metadata import AttentionMetadata
from sarathi_lab.engine.block_manager import blocks_for

# A decode joins the current group while its context is at least this share of the group's longest:
# at most 1 - share of a group's gathered rows are padding.
GROUP_SHARE = 0.7
# Shorter runs of consecutive blocks are gathered: a separate attention call costs more than the
# copy it saves (measured on cpu-small).
MIN_RUN = 8


@dataclass
class DecodeGroup:
    rows: torch.Tensor | None  # decode indices (into the decodes) of this group; None: all, in order
    blocks: torch.Tensor  # int64 [n * nblocks]: the group's block tables, flattened
    n: int
    nblocks: int
    ctx: int  # keys attended: the longest context when masked, else the common one
    # [n, 1, 1, keys], True/0 where a key is attended (bool for F.sdpa, additive for the flash op);
    # None if all contexts are equal.
    mask: torch.Tensor | None
    # [n, 1, keys, 1], True at padding keys (zeroed: an unwritten slot may hold a previous owner's
    # NaN, and NaN times a zero weight is NaN).
    pad: torch.Tensor | None = None


@dataclass
class DecodePlan:
    groups: list[DecodeGroup]
    runs: list[tuple[int, int, int]]  # parts read in place: (decode index, first block, tokens)
    # Decode index of every part, groups' rows then runs; None when nothing is in place.
    owners: torch.Tensor | None = None
    single: bool = True  # every decode has exactly one part: no merge needed


def plan_decodes(meta: AttentionMetadata, block_size: int, device: torch.device) -> DecodePlan:
    p, n = meta.num_prefills, meta.num_decodes
    if not n:
        return DecodePlan([], [])
    runs: list[tuple[int, int, int]] = []
    rest: dict[int, tuple[list[int], int]] = {}  # decode index -> (gathered blocks, their tokens)
    if device.type == "cpu":
        for i, (table, ctx) in enumerate(zip(meta.block_tables[p:].tolist(), meta.seq_lens_host[p:])):
            blocks, tokens = [], 0
            for first, last in _block_runs(table[: blocks_for(ctx, block_size)]):
                run_tokens = min(ctx, (last + 1) * block_size) - first * block_size
                if last + 1 - first >= MIN_RUN:
                    runs.append((i, table[first], run_tokens))
                else:
                    blocks += table[first : last + 1]
                    tokens += run_tokens
            if blocks:
                rest[i] = (blocks, tokens)
    if not runs:
        groups, _ = _groups(meta, list(range(n)), None, block_size, device)
        return DecodePlan(groups, [])
    groups, members = _groups(meta, sorted(rest), rest, block_size, device)
    owners = [i for rows in members for i in rows] + [i for i, _, _ in runs]
    return DecodePlan(groups, runs, torch.tensor(owners, dtype=torch.long, device=device), single=len(owners) == n)


def _block_runs(table: list[int]):
    """(first, last) table positions of each run of consecutive block ids."""
    for _, run in itertools.groupby(range(len(table)), key=lambda j: table[j] - j):
        run = list(run)
        yield run[0], run[-1]


def _groups(meta: AttentionMetadata, rows: list[int], rest, block_size: int,
            device) -> tuple[list[DecodeGroup], list[list[int]]]:
    """Padded gather groups of decodes of similar length; ``rest``: partial blocks to gather."""
    if not rows:
        return [], []
    p = meta.num_prefills
    all_lens = meta.seq_lens_host[p:]
    length = (lambda i: all_lens[i]) if rest is None else (lambda i: rest[i][1])
    order = sorted(rows, key=lambda i: -length(i))
    grouped, current = [], [order[0]]
    for i in order[1:]:
        if length(i) >= GROUP_SHARE * length(current[0]):
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
        nblocks = blocks_for(ctx, block_size)
        idx = None if whole else torch.tensor(members, dtype=torch.long, device=device)
        if rest is None:
            tables = meta.block_tables[p:]
            table = tables[:, :nblocks] if whole else tables.index_select(0, idx)[:, :nblocks]
            table = table.reshape(-1).to(torch.long)
        else:
            table = torch.tensor([rest[i][0] + [0] * (nblocks - len(rest[i][0])) for i in members],
                                 dtype=torch.long, device=device).reshape(-1)
        mask = pad = None
        if any(length(i) != ctx for i in members):
            keys = torch.arange(nblocks * block_size, device=device)
            member_lens = torch.tensor([length(i) for i in members], device=device)
            mask = (keys[None, :] < member_lens[:, None])[:, None, None, :]
            pad = ~mask.view(len(members), 1, -1, 1)
            if rest is not None:
                mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, float("-inf"))
        groups.append(DecodeGroup(idx, table, len(members), nblocks, ctx, mask, pad))
        group_members.append(members)
    return groups, group_members
