"""A GPU lease's kernel tables (the ``tune`` step's cuBLAS projections, the ``attention`` step's
engine attention) as gpu_kernels.py's rows, so that calibration.fit_lease refits a device to the
engine that lease ran."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.model import load_config
from sarathi_lab.model.shape import Shape

if TYPE_CHECKING:
    import pandas as pd

LEASES_DIR = REPO_ROOT / "docs" / "gpu"
GEMM_TABLE = Path("steps") / "tune" / "tune_gemm.csv"
ATTENTION_TABLE = Path("steps") / "attention" / "attention.csv"
# The engine's own GEMM in a lease (cuBLAS wherever Triton did not win): what graphs replay.
GEMM_CANDIDATE = "cublas"
KERNEL_COLUMNS = ("model", "op", "tokens", "context", "batch", "seconds")


def newest_lease(device: str) -> Path | None:
    """``<date>_<commit>`` sorts by date."""
    found = sorted(p.parents[2] for p in (LEASES_DIR / device).glob(f"*/{GEMM_TABLE}")
                   if (p.parents[2] / ATTENTION_TABLE).is_file())
    return found[-1] if found else None


def lease_kernels(lease: Path) -> pd.DataFrame:
    """One layer on one GPU, seconds: cuBLAS projections by tokens, engine attention by batch."""
    import pandas as pd

    gemm = pd.read_csv(lease / GEMM_TABLE)
    gemm = gemm[(gemm.candidate == GEMM_CANDIDATE) & gemm.error.isna()]
    gemm = (gemm.groupby(["model", "projection", "m"]).ms.median().reset_index()
            .rename(columns={"projection": "op", "m": "tokens"}).assign(context=0, batch=0))
    gemm["seconds"] = gemm.pop("ms") / 1e3
    att = pd.read_csv(lease / ATTENTION_TABLE)
    # The attention table names heads, not models.
    shapes = {m: Shape.of(load_config(m)) for m in sorted(gemm.model.unique())}
    models = {(s.heads, s.kv_heads): m for m, s in shapes.items()}
    att = att.assign(model=[models.get((h, k)) for h, k in zip(att.heads, att.kv_heads)])
    att = att.dropna(subset=["model"])
    att = att[att.engine_ms.notna()]
    decode = att.kind == "decode"
    rows = pd.DataFrame({"model": att.model,
                         "op": ["decode_attention" if d else "prefill_attention" for d in decode],
                         "tokens": att.batch.where(decode, att.query_len), "context": att.context,
                         "batch": att.batch, "seconds": att.engine_ms / 1e3})
    return pd.concat([gemm, rows], ignore_index=True)[list(KERNEL_COLUMNS)]
