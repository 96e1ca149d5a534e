"""`python -m sarathi_lab.run [-m] key=value ...`: one engine run per composed config.

Exit codes: 0 done; 1 a run (or, with -m, any job of the sweep) failed; 2 a bad command line or
configuration, reported as one line before any work (with -m under the basic launcher, any job's,
before the first job runs: harness/sweep_check.py); 128+N interrupted by signal N, partial records saved.
Only Hydra is imported until a run starts, so that --help, --cfg and a refused command line answer
in well under two seconds.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import sys

_INTERRUPTED = "interrupted ({}) outside a run: no run was started or changed"


def _interrupted_outside_a_run(signum, frame) -> None:
    # Until a run takes the signal over (harness/interrupts.py, to save what it measured), nothing of
    # a run is half-written: leave at once, without a traceback. Raising KeyboardInterrupt here
    # instead lost the signal now and then: raised inside a weakref callback (importlib's module
    # locks run one as each import ends) or a finalizer, it is printed as ignored, and start-up went
    # on as if never signalled.
    print(_INTERRUPTED.format(signal.Signals(signum).name), file=sys.stderr)
    os._exit(128 + signum)


def _leave_on_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupted_outside_a_run)


if __name__ == "__main__":
    _leave_on_signals()

import hydra  # after the handler: importing Hydra is the first half second
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness import CONF_DIR

log = logging.getLogger("sarathi_lab.run")
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    import signal
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.interrupts import Interrupted, signals_interrupt
    from sarathi_lab.harness.results import write_status
    from sarathi_lab.harness.runner import RunContext, claim_status_dir, record_failure, run_experiment
    from sarathi_lab.harness.schema import parse_config
    from sarathi_lab.model import ModelLoadError

    hc = HydraConfig.get()
    # In a sweep a failed job is recorded and the sweep goes on; SweepSummary exits non-zero at the end.
    multirun = hc.mode == RunMode.MULTIRUN
    name = cfg.get("name", "run")
    ctx = RunContext(output_dir=Path(hc.runtime.output_dir), overrides=list(hc.overrides.task),
                     group=f"{name}-{Path(hc.sweep.dir).name}" if multirun else None,
                     hydra_record={"config.yaml": cfg, "hydra.yaml": OmegaConf.create({"hydra": hc}),
                                   "overrides.yaml": OmegaConf.create(list(hc.overrides.task))},
                     sweep_job=multirun)
    try:
        claim_status_dir(ctx)
    except ConfigError as e:  # the directory is another run's: nothing of this one is recorded there
        log.error("%s", e)
        if not multirun:
            raise SystemExit(2) from None
        return
    try:
        with signals_interrupt(signal.SIGINT, signal.SIGTERM):
            run_cfg = parse_config(cfg)
            status = run_experiment(run_cfg, OmegaConf.to_container(cfg, resolve=True), ctx)
            # Inside: a signal once the handler is back to leaving at once would leave `running`.
            write_status(ctx.status_dir, status)
    except Interrupted as e:
        record_failure(ctx.status_dir, e)
        if not any(ctx.status_dir.glob("*.partial.*")):  # else the run said where it saved them
            log.error("interrupted by %s before the run measured anything; %s says so", e,
                      ctx.status_dir / "status.json")
        raise SystemExit(e.exit_code) from None
    except (ConfigError, ModelLoadError) as e:
        record_failure(ctx.status_dir, e)
        log.error("%s", e)
        if not multirun:
            raise SystemExit(2) from None
    except OSError as e:
        if e.errno not in _ENVIRONMENT_ERRNOS:
            _failed(ctx.status_dir, e, multirun)
            return
        # The machine's fault (full disk, file size limit, a filesystem gone read-only), said in one
        # line naming the file; what was written goes to temporary names and is renamed, so no result
        # is half-written.
        _record_quietly(ctx.status_dir, e)
        log.error("cannot write %s: %s; the run stopped (nothing half-written)", e.filename or ctx.status_dir,
                  e.strerror or e)
        if not multirun:
            raise SystemExit(1) from None
    except Exception as e:  # noqa: BLE001 - recorded and logged with its traceback (_failed)
        _failed(ctx.status_dir, e, multirun)
    finally:
        ctx.release()


def _failed(status_dir, e: Exception, multirun: bool) -> None:
    from sarathi_lab.harness.runner import record_failure

    record_failure(status_dir, e)
    log.exception("run failed; error recorded in %s", status_dir / "status.json")
    if not multirun:
        raise SystemExit(1) from None


def _record_quietly(status_dir, e: BaseException) -> None:
    """status.json of a run stopped by e, where the disk still takes it."""
    from sarathi_lab.harness.runner import record_failure

    try:
        record_failure(status_dir, e)
    except OSError:
        pass


def cli() -> None:
    # Ctrl-C outside a run (checking the command line, composing, importing torch, between a sweep's
    # jobs) ended in a 70-line KeyboardInterrupt traceback; it leaves at once with one line, and a run
    # itself records it (interrupts.py). Installed here too for a caller that imports this module.
    _leave_on_signals()
    try:
        _cli()
    except KeyboardInterrupt:  # raised by code of its own, not by our handlers
        print(_INTERRUPTED.format("SIGINT"), file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None


def _cli() -> None:
    from sarathi_lab import cli_args
    from sarathi_lab.harness.cli_check import check_command_line, output_dir_problem, sweep_note

    args = sys.argv[1:]
    if not {"--help", "-h", "--hydra-help"} & set(args):
        error = check_command_line(args)
        if error:
            cli_args.refuse(error)
        problem = output_dir_problem(args)
        if problem:
            print(f"error: {problem[0]}", file=sys.stderr)
            raise SystemExit(problem[1])
        note = sweep_note(args)
        if note:
            print(note, file=sys.stderr)
    main()


if __name__ == "__main__":
    cli()
