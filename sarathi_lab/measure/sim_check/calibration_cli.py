"""``python -m sarathi_lab.measure calibration``: fits every measured GPU's
calibration (calibration.fit; refitted by calibration.fit_lease to the newest GPU lease's kernel
tables) and writes it into its device file, keeping everything above the marker line as written
(``--out DIR``: the device files written there instead)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import yaml

from sarathi_lab import cli_args, output_files, provenance
from sarathi_lab.config import REPO_ROOT
from sarathi_lab.measure.sim_check.convert_gpu_kernels import kept_tokens
from sarathi_lab.model import load_config
from sarathi_lab.model.shape import Shape
from sarathi_lab.sim import gpu_kernels
from sarathi_lab.sim.calibration import Calibration, fit, fit_lease
from sarathi_lab.sim.device import DEVICES_DIR, GPU_DEVICES, load_device

MARKER = "# ---- calibration: written by python -m sarathi_lab.measure calibration"
# A lease's tables: the ``tune`` step's cuBLAS projections, the ``attention`` step's engine
# attention, read as gpu_kernels.py's rows.
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
    att = att.dropna(subset=["model", "engine_ms"])
    decode = att.kind == "decode"
    rows = pd.DataFrame({"model": att.model,
                         "op": ["decode_attention" if d else "prefill_attention" for d in decode],
                         "tokens": att.batch.where(decode, att.query_len), "context": att.context,
                         "batch": att.batch, "seconds": att.engine_ms / 1e3})
    return pd.concat([gemm, rows], ignore_index=True)[list(KERNEL_COLUMNS)]


def _round(value):
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


# A device nobody measured -> the measured device of the same chip whose shares of peak it takes.
BORROWED = {"a6000": "a40"}


def calibrations() -> dict[str, Calibration]:
    """Without measured attention, the A100's (calibration.fit); BORROWED, a sibling's."""
    measured = [d for d in gpu_kernels.measured_devices() if d in GPU_DEVICES]
    out = {}
    for name in sorted(measured, key=lambda d: d != "a100"):
        borrowed = (out["a100"], load_device("a100").peak_flops) if "a100" in out else None
        device = load_device(name)
        out[name] = fit(device, attention_from=borrowed)
        if (lease := newest_lease(name)) is not None:
            out[name] = fit_lease(out[name], lease_kernels(lease), device.peak_flops,
                                  device.memory_bandwidth, f"lease {lease.name}")
    for name, sibling in BORROWED.items():
        if sibling in out:
            out[name] = out[sibling]
    return out


def as_yaml(cal: Calibration, device: str) -> str:
    keep = [i for i, t in enumerate(cal.gemm_tokens) if kept_tokens(t)]
    cal = dataclasses.replace(cal, **{f: tuple(getattr(cal, f)[i] for i in keep)
                                      for f in ("gemm_tokens", "gemm_efficiency", "gemm_launch_s")})
    lease = next((f for f in cal.fitted_from if f.startswith("lease ")), None)
    attention = ("the A100's attention fit, scaled by the GEMM efficiency ratio (no attention "
                 "measured here)"
                 if device != "a100" else "attention: vidur's A100 Llama-2-7B attention.csv rows")
    if lease:
        attention = (f"then refitted to the GPU {lease} "
                     f"(docs/gpu/{device}/{lease.split()[1]}/steps/: the engine's attention, "
                     f"cuBLAS projections between the token counts it timed)")
    measured_on = (f" on the {BORROWED[device].upper()} (same chip; nothing measured on this one)"
                   if device in BORROWED else "")
    vidur = ", ".join(f for f in cal.fitted_from if f != lease)
    head = (f"{MARKER}\n# Fitted to measured GPU kernels (sim/data/gpu_kernels/README.md: vidur, "
            f"MIT) of\n# {vidur}{measured_on};\n# {attention}. Efficiencies are shares of the "
            f"peaks above.\n")
    return head + yaml.safe_dump({"calibration": _round(dataclasses.asdict(cal))},
                                 default_flow_style=None, sort_keys=False, width=110)


def outputs(cals: dict[str, Calibration], out: Path, force: bool) -> output_files.Outputs:
    """A device file fitted to another lease (or to none) is replaced only with --force."""
    made = {f"{device}.yaml": provenance.Provenance(
        "computed: calibration fitted to measured GPU kernels",
        lease=next((f.split()[1] for f in cal.fitted_from if f.startswith("lease ")), ""),
        writer="python -m sarathi_lab.measure calibration")
        for device, cal in cals.items()}
    return output_files.Outputs(out, made, given=f"--out={out}", force=force,
                                how="--force replaces them; --out DIR writes elsewhere")


def main(argv: list[str] | None = None) -> None:
    p = cli_args.Parser(prog="python -m sarathi_lab.measure calibration", description=__doc__)
    cli_args.shared(p, out="where the device files go", out_default=DEVICES_DIR,
                    force="replace device files of another provenance")
    args = p.parse_args(argv)
    try:
        output_files.Outputs(args.out, {}, given=f"--out={args.out}").check()
        cals = calibrations()
        out = outputs(cals, args.out, args.force)
        for device, cal in cals.items():
            head = (DEVICES_DIR / f"{device}.yaml").read_text().split(MARKER)[0].rstrip("\n")
            out.add(f"{device}.yaml", head + "\n" + as_yaml(cal, device))
        for path in out.write():
            print(f"wrote {path}")
    except ValueError as e:
        p.error(str(e))

