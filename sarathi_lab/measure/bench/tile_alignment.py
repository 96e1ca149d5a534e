"""SARATHI's decode speedup (Fig. 8, Table 2) with the chunk sized so that chunk + decodes fill
whole 128-token tiles, beside the fixed chunk that overflows them, as each GPU cost model predicts
task=piggyback's three iterations (docs/sim/README.md, section 6)."""
from __future__ import annotations

import itertools
import warnings

import pandas as pd

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.analysis import quantities
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.engine.tiles import aligned_chunk
from sarathi_lab.sim.cost_model import CostModel, batch_tokens

# LLaMA-33B on an A100 (kernels never measured), and Llama-2-7B, whose were (profile).
CASES = (("llama-33b", "a100", ("roofline", "calibrated")),
         ("llama2-7b", "a100", ("roofline", "calibrated", "profile")))
SEQ_LENS = (1024, 2048, 3072)
BATCH_SIZES = (2, 6, 12, 18)
DOCS = REPO_ROOT / "docs" / "sim"


def piggyback_ms(cm: CostModel, chunk: int, batch_size: int, seq_len: int) -> pd.DataFrame:
    made = {"decode_only": ([], [seq_len] * batch_size), "chunk_alone": ([(chunk, chunk)], []),
            "hybrid": ([(chunk, chunk)], [seq_len] * (batch_size - 1))}
    return pd.DataFrame([{"iteration": kind, "ms": cm.iteration_cost(p, d).forward_s * 1e3,
                          "tokens": batch_tokens(p, d)} for kind, (p, d) in made.items()])


def sweep(cases=CASES, chunk: int = 256, seq_lens=SEQ_LENS,
          batch_sizes=BATCH_SIZES) -> pd.DataFrame:
    rows = []
    for model, device, cost_models in cases:
        for cost_model in cost_models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the profile's note on what it models
                cm = CostModel.for_device(device, model, cost_model)
            for seq_len, b in itertools.product(seq_lens, batch_sizes):
                aligned = aligned_chunk(chunk, b - 1)
                for alignment, c in (("unaligned", chunk), ("aligned", aligned)):
                    table = piggyback_ms(cm, c, b, seq_len).assign(seq_len=seq_len, batch_size=b,
                                                                   chunk=c)
                    row = quantities.decode_speedup(table).iloc[0]
                    rows.append({"model": model, "device": device, "cost_model": cost_model,
                                 "alignment": alignment, "seq_len": seq_len, "batch_size": b,
                                 "chunk": c, "hybrid_tokens": c + b - 1, "gain": float(row.gain)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    p = cli_args.Parser(prog="python -m sarathi_lab.measure tile_alignment",
                        description=__doc__.splitlines()[0])
    cli_args.shared(p, out="the table (.csv)", out_default=DOCS / "tile_alignment.csv",
                    force="replace a table another command wrote")
    args = p.parse_args(argv)
    prov = provenance.Provenance("computed: simulated decode speedup by chunk alignment",
                                 writer="python -m sarathi_lab.measure tile_alignment")
    out = output_files.Outputs(args.out.parent, {args.out.name: prov}, given=f"--out={args.out}",
                               force=args.force,
                               how="--force replaces it; --out FILE writes elsewhere")
    try:
        out.check()
    except output_files.OutputRefused as e:
        p.error(str(e))
    table = sweep()
    wide = table.pivot_table(index=["model", "cost_model", "seq_len", "batch_size"],
                             columns="alignment", values="gain").reset_index()
    pd.set_option("display.width", 160)
    print("Decode speedup (simulated), chunk 256 beside the tile-aligned chunk:")
    print(wide.round(2).to_string(index=False))
    out.add(args.out.name, table.to_csv(index=False, float_format="%.4g"))
    try:
        out.write()
    except output_files.OutputRefused as e:
        p.error(str(e))
    return table
