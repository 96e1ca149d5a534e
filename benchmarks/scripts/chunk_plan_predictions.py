"""The balanced chunk attention's predicted time at the attention step's chunk shapes, beside a lease's
measured times: today's grid and the plan in chunk_plan.py's units (key tiles walked, a piece's fixed
costs counted), and the measured time scaled by their ratio above the launch floor.

    PYTHONPATH=<worktree>:<worktree>/kernels python benchmarks/scripts/chunk_plan_predictions.py \
        docs/gpu/h100/2026-11-27_7fae342/steps/attention/attention.csv

Prints a markdown table (the H100's SMs; the kernels' sm_90 occupancy).
"""
import csv
import sys

from sarathi_kernels.attention_plan import default_tiles, plan_launch, prefill_tiles_for, wave_of
from sarathi_kernels.chunk_plan import grid_path, piece_cap, plan_chunks
from sarathi_kernels.occupancy import H100

LAUNCH_US = 4.0  # the step's launch floor (floor_ms where floor_bound is "launch")

print("| heads | chunk | prefix | H100 us today | best peer us | today / peer | today's splits "
      "| today's path / ideal | plan's path / ideal | predicted us | predicted / peer |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
with open(sys.argv[1]) as f:
    rows = list(csv.DictReader(f))
for r in rows:
    if r["kind"] != "chunk":
        continue
    h, kv, c, ctx = int(r["heads"]), int(r["kv_heads"]), int(r["query_len"]), int(r["context"])
    group_pad = 1 << (h // kv - 1).bit_length()
    tiles = prefill_tiles_for(c, group_pad, default_tiles())
    slots, block_q = wave_of("prefill", tiles, H100), tiles.block_m // group_pad
    splits = plan_launch(c, 1, h, kv, max_seq_len=ctx, max_query_len=c, limits=H100).num_splits
    work = plan_chunks([c], [ctx], kv, block_q, tiles.block_n, slots, max_pieces=piece_cap(c))
    today = grid_path([c], [ctx], kv, block_q, tiles.block_n, slots, splits)
    us, peer = float(r["engine_ms"]) * 1e3, float(r["best_peer_ms"]) * 1e3
    predicted = LAUNCH_US + (us - LAUNCH_US) * min(work.critical_path / today, 1.0)
    print(f"| {h}/{kv} | {c} | {ctx - c} | {us:.1f} | {peer:.1f} | {us / peer:.2f} | {splits} "
          f"| {today / work.ideal:.2f} | {work.critical_path / work.ideal:.2f} | {predicted:.1f} "
          f"| {predicted / peer:.2f} |")
