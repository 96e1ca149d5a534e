"""`python -m sarathi_lab.run [-m] key=value ...`: one engine run per composed config. Exit 0 done;
1 a run (with -m, any job) failed; 2 a bad command line or configuration; 128+N signal N. Only Hydra
is imported until a run starts, so that --help, --cfg and a refusal answer fast."""
from __future__ import annotations

import os
import signal
import sys

_INTERRUPTED = "interrupted ({}) outside a run: no run was started or changed"


def _interrupted_outside_a_run(signum, frame) -> None:
    # Nothing is half-written yet; a KeyboardInterrupt in a finalizer would be ignored.
    print(_INTERRUPTED.format(signal.Signals(signum).name), file=sys.stderr)
    # Between a sweep's jobs: how to resume it (the module is loaded once a sweep has started).
    resume_line = getattr(sys.modules.get("sarathi_lab.harness.sweep_resume"), "resume_line", None)
    if resume_line is not None and (line := resume_line()):  # None too while it is being imported
        print(line, file=sys.stderr)
    os._exit(128 + signum)


def _on_signals(handler) -> None:
    """Left to Python, a signal landing while the interpreter exits ended it without a word."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


if __name__ == "__main__":
    _on_signals(_interrupted_outside_a_run)

import contextlib  # after the handler: a signal while a module loads would print a traceback
import errno
import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from sarathi_lab.harness import CONF_DIR

log = logging.getLogger("sarathi_lab.run")
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES,
                       errno.EPERM, errno.EIO}


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from sarathi_lab.config import ConfigError
    from sarathi_lab.harness.interrupts import Interrupted
    from sarathi_lab.harness.results import STATUS
    from sarathi_lab.harness.runner import RunContext, claim_status_dir, record_failure
    from sarathi_lab.harness.sweep_resume import resume_line
    from sarathi_lab.harness.wandb_logger import sweep_group

    hc = HydraConfig.get()
    # A sweep's failed job is recorded and the sweep goes on.
    multirun = hc.mode == RunMode.MULTIRUN
    name = cfg.get("name", "run")
    ctx = RunContext(output_dir=Path(hc.runtime.output_dir), overrides=list(hc.overrides.task),
                     group=sweep_group(name, hc.sweep.dir) if multirun else None,
                     hydra_record={"config.yaml": cfg,
                                   "hydra.yaml": OmegaConf.create({"hydra": hc}),
                                   "overrides.yaml": OmegaConf.create(list(hc.overrides.task))},
                     sweep_job=multirun)
    try:
        claim_status_dir(ctx)
    except ConfigError as e:
        _refuse(e, multirun)
        return
    try:
        _run_and_record(cfg, ctx)
        if not multirun:
            _on_signals(signal.SIG_IGN)
    except Interrupted as e:
        record_failure(ctx.status_dir, e)
        if not any(ctx.status_dir.glob("*.partial.*")):
            log.error("interrupted by %s before the run measured anything; %s says so", e,
                      ctx.status_dir / STATUS)
        if multirun and (line := resume_line()):
            log.error("%s", line)
        raise SystemExit(e.exit_code) from None
    except ConfigError as e:
        record_failure(ctx.status_dir, e)
        _refuse(e, multirun)
    except Exception as e:
        if isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS:
            # The machine's fault, in one line: results are renamed into place, none half-written.
            with contextlib.suppress(OSError):
                record_failure(ctx.status_dir, e)
            log.error("cannot write %s: %s; the run stopped (nothing half-written)",
                      e.filename or ctx.status_dir, e.strerror or e)
        else:
            record_failure(ctx.status_dir, e)
            log.exception("run failed; error recorded in %s", ctx.status_dir / STATUS)
        if not multirun:
            raise SystemExit(1) from None
    finally:
        ctx.release()


def _run_and_record(cfg: DictConfig, ctx) -> None:
    """The status is written while signals still interrupt (else one could leave it `running`),
    and a signal's status as it lands."""
    from sarathi_lab.harness.gc_thresholds import fewer_collections
    from sarathi_lab.harness.interrupts import Interrupted, interruption_of, signals_interrupt
    from sarathi_lab.harness.results import write_status
    from sarathi_lab.harness.runner import record_failure, run_experiment
    from sarathi_lab.harness.schema import parse_config

    def interrupted(signum: int) -> None:
        # At once: the signal's exception can be swallowed (torch's import does now and then),
        # and a sweep's parent kills the job whose grace runs out before it is handled.
        record_failure(ctx.status_dir, Interrupted(signum))

    try:
        with signals_interrupt(signal.SIGINT, signal.SIGTERM, on_signal=interrupted):
            run_cfg = parse_config(cfg)
            with fewer_collections(run_cfg.engine.kind.gc_gen0_threshold):
                status = run_experiment(run_cfg, OmegaConf.to_container(cfg, resolve=True), ctx)
            write_status(ctx.status_dir, status)
            if status == "ok" and run_cfg.export.timeline:

                _export_timeline(ctx.status_dir)
    except Exception as e:
        if (signalled := interruption_of(e)) is None:
            raise
        raise signalled from None


def _refuse(e: Exception, multirun: bool) -> None:
    if multirun:
        log.error("%s", e)
        return
    from sarathi_lab import cli_args

    cli_args.refuse(str(e))


def _export_timeline(run_dir) -> None:
    """A failure is a warning: the run itself is whole."""
    from sarathi_lab.analysis.timeline import export_timelines

    try:
        written = export_timelines(run_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("no timeline written: %s: %s", type(e).__name__, e)
        return
    for path in written:
        log.info("timeline (Chrome / Perfetto trace): %s", path)
    if not written:
        log.info("no timeline written: %s holds no serving run's iterations", run_dir)


def _serves_a_driver() -> bool:
    """Under torchrun, every rank but 0 serves rank 0's engines (its shard) until rank 0 leaves."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or int(os.environ.get("RANK", "0")) == 0:
        return False
    from sarathi_lab.model.parallel.worker import from_torchrun

    from_torchrun()
    return True


def _resume_or_not(args: list[str]) -> list[str]:
    """The same sweep command again: its newest unfinished sweep offered (taken under
    on_existing=skip); Hydra reads the command line from sys.argv."""
    from sarathi_lab.harness import sweep_resume
    from sarathi_lab.harness.cli_check import resumable

    if (found := resumable(args)) is not None:
        args = sweep_resume.offer(args, *found)
        sys.argv[1:] = args
    sweep_resume.note_command_line(args)
    return args


def cli() -> None:

    _on_signals(_interrupted_outside_a_run)
    # A log file on a full disk would print a traceback after the run's one-line error.
    logging.raiseExceptions = False
    if _serves_a_driver():
        return
    args = sys.argv[1:]
    try:
        from sarathi_lab import cli_args
        from sarathi_lab.harness.cli_check import (
            added_knobs,
            check_command_line,
            output_dir_problem,
            sweep_note,
        )


        if not {"--help", "-h", "--hydra-help"} & set(args):
            if (added := added_knobs(args)) != args:
                args = sys.argv[1:] = added  # Hydra reads the command line from sys.argv
            if error := check_command_line(args):
                cli_args.refuse(error)
            if problem := output_dir_problem(args):
                print(f"error: {problem[0]}", file=sys.stderr)
                raise SystemExit(problem[1])
            if note := sweep_note(args):
                print(note, file=sys.stderr)
            if {"-m", "--multirun"} & set(args) and not {"--cfg", "-c"} & set(args):
                args = _resume_or_not(args)
        main()
        _on_signals(signal.SIG_IGN)
    except KeyboardInterrupt:  # raised by code of its own, not by our handlers
        print(_INTERRUPTED.format("SIGINT"), file=sys.stderr)
        _leave(128 + signal.SIGINT)
    except SystemExit as e:
        _leave(e.code)
    _leave(0)


def _owns_the_process() -> bool:
    """Started as ``python -m sarathi_lab.run``, not run inside another program's process (the GPU
    suite's worker runs sweeps so, and goes on after them)."""
    argv = sys.orig_argv
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == [__spec__.name]


def _leave(code) -> None:
    """SystemExit(code), or, where this process joined ranks, its exit handlers (the ranks' STOP,
    W&B, logging) and then os._exit: past them nothing of ours is left, and the interpreter's
    teardown could abort on gloo's threads (model/parallel/driver.py)."""
    driver = sys.modules.get("sarathi_lab.model.parallel.driver")
    if not getattr(driver, "joined", False) or not _owns_the_process():
        raise SystemExit(code)
    if not isinstance(code, int):
        # SystemExit's own rule: None is success, anything else is printed and fails.
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    cli()
