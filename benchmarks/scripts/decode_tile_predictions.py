"""What finer decode key tiles would do to the balanced decode work of 32/8-head models (Mistral-7B,
Llama-3-8B): the plan's critical path (chunk_plan.plan_chunks, as plan_decodes calls it) at every
decode count 1-64 on 16/32-key tiles against today's 64, in 64-key tiles, and the counts whose step
from the count before exceeds twice its added KV read (tests/test_split_rule.py's bound).

    PYTHONPATH=<worktree>:<worktree>/kernels python benchmarks/scripts/decode_tile_predictions.py

Two unmeasured inputs are swept: a key-tile step's fixed cost in keys' worth (``step``: a tile of n
keys costs as n + step keys) and a split piece's cost (the split rule's 1.0 tile, or a decode
partial's own size: its group_pad rows against a 64-row query tile). The ms column converts the path
saved with the H100 lease's decode fit (0.0729 ms a key tile of path for LLaMA-13B's 40 layers),
scaled to 32 layers: the same KV bytes a tile a layer.
"""
import itertools

from sarathi_kernels.attention_plan import DECODE, default_tiles, wave_of
from sarathi_kernels.chunk_plan import piece_cap, plan_chunks
from sarathi_kernels.occupancy import H100
from sarathi_kernels.split_rule import cdiv

MS_PER_TILE = 0.0729 * 32 / 40
KV_HEADS, GROUP_PAD, UNIT = 8, 4, 64


def path(count: int, ctx: int, block_n: int, step: float, split: float, slots: int) -> float:
    cost = (block_n + step) / (UNIT + step)
    work = plan_chunks([1] * count, [ctx] * count, KV_HEADS, 1, block_n, slots,
                       split_cost=split / cost, max_pieces=piece_cap(count), base_cost=0.0)
    return work.critical_path * cost


def main() -> None:
    slots = wave_of(DECODE, default_tiles().decode, H100)
    print("| ctx | tile | step keys | split cost | counts over 2x read (first 6) "
          "| mean path saved (tiles) | mean ms saved an iteration | range ms saved |")
    print("|---|---|---|---|---|---|---|---|")
    for ctx in (1024, 3072):
        read = [count * KV_HEADS * cdiv(ctx, UNIT) / slots for count in range(1, 65)]
        today = [path(count, ctx, UNIT, 0.0, 1.0, slots) for count in range(1, 65)]
        rows = [(UNIT, 0.0, 1.0), (UNIT, 0.0, GROUP_PAD / UNIT)]
        rows += [(n, step, split) for n in (32, 16) for step in (0.0, 8.0)
                 for split in (1.0, GROUP_PAD / UNIT)]
        for block_n, step, split in rows:
            paths = [path(c, ctx, block_n, step, split, slots) for c in range(1, 65)]
            steps = zip(itertools.count(2), itertools.pairwise(paths), itertools.pairwise(read))
            over = [c for c, (a, b), (ra, rb) in steps if b - a > 2 * (rb - ra)]
            saved = [t - p for t, p in zip(today, paths)]
            ms = [s * MS_PER_TILE for s in saved]
            print(f"| {ctx} | {block_n} | {step:g} | {split:g} | {len(over)} {over[:6]} "
                  f"| {sum(saved) / len(saved):.2f} | {sum(ms) / len(ms):+.3f} "
                  f"| {min(ms):+.3f} to {max(ms):+.3f} |")


if __name__ == "__main__":
    main()
