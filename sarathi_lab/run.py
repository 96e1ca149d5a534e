"""`python -m sarathi_lab.run [-m] key=value ...`: one engine run per composed config.

Exit codes: 0 done; 1 a run (or, with -m, any job of the sweep) failed; 2 bad configuration,
reported as one line before any work; 128+N interrupted by signal N, partial records saved.
"""
from __future__ import annotations

import logging
import signal
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.config import ConfigError
from sarathi_lab.harness import CONF_DIR
from sarathi_lab.harness.cli_check import bad_group_choice
from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt
from sarathi_lab.harness.results import write_status
from sarathi_lab.harness.runner import RunContext, run_experiment
from sarathi_lab.harness.schema import parse_config
from sarathi_lab.model import ModelLoadError

log = logging.getLogger("sarathi_lab.run")
BAD_INPUT = (ConfigError, ModelLoadError)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    # In a sweep a failed job is recorded and the sweep goes on; SweepSummary exits non-zero at the end.
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        with signals_interrupt(signal.SIGINT, signal.SIGTERM):
            run_cfg = parse_config(cfg)
            ctx = RunContext(output_dir=out, overrides=list(hc.overrides.task),
                             run_name=hc.job.override_dirname or run_cfg.name,
                             group=f"{run_cfg.name}-{Path(hc.sweep.dir).name}" if multirun else None)
            status = run_experiment(run_cfg, OmegaConf.to_container(cfg, resolve=True), ctx)
        write_status(out, status)
    except Interrupted as e:
        write_status(out, "interrupted", error=f"interrupted by {e}")
        raise SystemExit(e.exit_code) from None
    except BAD_INPUT as e:
        write_status(out, "failed", error=str(e))
        log.error("%s", e)
        if not multirun:
            raise SystemExit(2) from None
    except Exception as e:
        write_status(out, "failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        log.exception("run failed; error recorded in %s", out / "status.json")
        if not multirun:
            raise SystemExit(1) from None


if __name__ == "__main__":
    error = bad_group_choice(sys.argv[1:])
    if error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)
    main()
