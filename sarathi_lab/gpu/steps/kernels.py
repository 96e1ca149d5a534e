"""The compiled Triton kernels: kernels/check_gpu.py run as a script (it refuses an interpreter-mode
Triton), its printed lines read into metrics; decode KV bandwidth against the env step's copy
ceiling, target within 1.5x of that floor."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict

from sarathi_lab.config import REPO_ROOT
from sarathi_lab.gpu.context import Context, Incomplete, Unavailable
from sarathi_lab.gpu.state import Metric
from sarathi_lab.gpu.steps.env import ceilings

CHECK_GPU = REPO_ROOT / "kernels" / "check_gpu.py"
FLOOR_TARGET = 1.5
_CASE = re.compile(r"^\s*torch\.(\w+)\s+d=\s*(\d+)\s+heads=(\d+)/(\d+)\s+block=(\d+):\s+(\S+)\s+(ok|FAIL)")
_WRITE = re.compile(r"^\s*kv write torch\.(\w+)\s+block=(\d+):\s+(ok|FAIL)")
_POINTWISE = re.compile(r"^\s*pointwise torch\.(\w+)\s+(\w+):\s+(ok|FAIL)")
_TIMING = re.compile(r"^\s*(\d+ decodes x \d+ ctx)\s+triton\s+([\d.]+) ms.*?KV\s+([\d.]+) GB/s")
_COPY = re.compile(r"copy bandwidth ([\d.]+) GB/s")
_TIMED = re.compile(r"^timings, torch\.(\w+), (.+); copy bandwidth")


def parse(text: str, copy_gbps: float | None) -> list[Metric]:
    """The worst error per dtype (check_gpu's own verdicts), the KV writes, and each decode case's
    bandwidth against the floor."""
    errors, verdicts = defaultdict(list), defaultdict(list)
    metrics = []
    for line in text.splitlines():
        if m := _CASE.match(line):
            errors[m[1]].append(float(m[6]))
            verdicts[m[1]].append(m[7] == "ok")
        elif m := _WRITE.match(line):
            verdicts[f"kv_write_{m[1]}"].append(m[3] == "ok")
        elif m := _POINTWISE.match(line):
            verdicts[f"pointwise_{m[1]}"].append(m[3] == "ok")
        elif (m := _COPY.search(line)) and copy_gbps is None:
            copy_gbps = float(m[1])
    for dtype, errs in errors.items():
        metrics.append(Metric(f"attention_max_rel_err_{dtype}", max(errs), "", "kernels/README tolerance",
                              all(verdicts[dtype])))
    metrics += [Metric(f"{k}_cases_ok", f"{sum(v)}/{len(v)}", "", "all", all(v))
                for k, v in verdicts.items() if k.startswith(("kv_write", "pointwise"))]
    for line in text.splitlines():
        if m := _TIMED.match(line):  # what the decode cases time, as check_gpu names it
            metrics.append(Metric("decode_timed_case", f"Triton paged attention, {m[2]}, {m[1]}"))
        elif (m := _TIMING.match(line)) and copy_gbps:
            name = m[1].replace(" ", "_")
            metrics.append(Metric(f"decode_kv_gbps[{name}]", float(m[3]), "GB/s"))
            ratio = copy_gbps / float(m[3])
            metrics.append(Metric(f"decode_time_over_floor[{name}]", round(ratio, 2), "x",
                                  f"<= {FLOOR_TARGET}", ratio <= FLOOR_TARGET))
    if not errors:
        raise ValueError("check_gpu printed no correctness line: its output format changed (see its log)")
    return metrics


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    if ctx.device != "cuda":
        if ctx.dry_run:
            return [Metric("compiled_kernels", "skipped: no CUDA in the dry run; the interpreter path is "
                           "tests/test_kernels.py")], []
        raise Unavailable("no CUDA device: check_gpu.py checks compiled kernels")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    log = ctx.dir / "check_gpu.log"
    try:
        proc = subprocess.run([sys.executable, str(CHECK_GPU)], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=ctx.seconds_left(), check=False)
    except subprocess.TimeoutExpired as e:
        log.write_text((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
        raise Incomplete("check_gpu.py ran past the call's budget") from e
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode and not any(_CASE.match(line) for line in proc.stdout.splitlines()):
        last = (proc.stderr.strip().splitlines() or ["no error printed"])[-1]
        raise RuntimeError(f"check_gpu.py exited {proc.returncode} before any check: {last} (see check_gpu.log)")
    record = ceilings(ctx.out)
    metrics = parse(proc.stdout, record["copy_gbps"] if record else None)
    metrics.append(Metric("check_gpu_exit", proc.returncode, "", "0", proc.returncode == 0))
    notes = [] if record else ["copy ceiling from check_gpu's own measure (the env step has not run)"]
    return metrics, notes
