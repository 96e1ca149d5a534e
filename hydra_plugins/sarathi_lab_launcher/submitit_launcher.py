"""hydra-submitit-launcher's local and Slurm launchers, made to finish a sweep whose jobs die.

The plugin collects each job with job.results(), which raises for a job whose process ended
without returning (SIGKILL, the OOM killer, a hard time limit, a crash): the launch aborts, the
jobs after it go uncollected and SweepSummary never runs. These launchers collect every job, and
record the death of one in its status.json, which it could not write itself. Selected with
hydra/launcher=submitit_local_safe or submitit_slurm_safe (conf/hydra/launcher/).

SIGINT or SIGTERM to the launching process takes the jobs down with it: each unfinished job is
sent SIGTERM (its run saves partial records and records `interrupted`), given GRACE_S, then
killed; a job that could not record itself is recorded `interrupted`, the sweep's summary is
written, and the launcher exits 128 + the signal. Left to themselves the jobs ran on unsupervised,
`running`, with no sweep_summary.json.

Hydra instantiates launchers only from the hydra_plugins package, and imports all of it at plugin
discovery: hence this location, and the imports of submitit and sarathi_lab (torch) inside methods.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher as plugin
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf, open_dict

log = logging.getLogger(__name__)
GRACE_S = 20.0


class _CollectEveryJob:
    # A mixin, not a Launcher: Hydra would list it as a plugin of its own.
    # The plugin's launch, which has no hook between submitting and collecting, with its last line
    # (collect, raising at the first dead job) replaced by _collect.
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        import submitit

        assert self.config is not None
        params = dict(self.params)
        executor = submitit.AutoExecutor(
            folder=params.pop("submitit_folder"), cluster=self._EXECUTOR,
            **{f"{self._EXECUTOR}_{k}": params.pop(k) for k in ["max_num_timeout"] if k in params})
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        log.info("Submitit '%s' sweep output dir : %s", self._EXECUTOR, sweep_dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        nums = list(range(initial_job_idx, initial_job_idx + len(job_overrides)))
        for num, overrides in zip(nums, job_overrides):
            log.info("\t#%d : %s", num, " ".join(filter_overrides(overrides)))
        started = time.time()
        from sarathi_lab.harness.interrupts import Interrupted, deferred_signals, signals_interrupt

        jobs = []
        try:
            with signals_interrupt(signal.SIGINT, signal.SIGTERM):
                # A signal while the jobs start waits until all have: map_array returns their handles
                # only then, and a job started but not returned would run on unsupervised.
                with deferred_signals(signal.SIGINT, signal.SIGTERM):
                    jobs += executor.map_array(self, [list(o) for o in job_overrides],
                                               ["hydra.sweep.dir"] * len(nums), nums,
                                               [f"job_id_for_{n}" for n in nums], [Singleton.get_state()] * len(nums))
                return [self._collect(job, num, overrides, started)
                        for job, num, overrides in zip(jobs, nums, job_overrides)]
        except Interrupted as e:
            self._take_down(jobs, nums, job_overrides, started, e)
            raise SystemExit(e.exit_code) from None

    def _take_down(self, jobs: list, nums: list[int], job_overrides: Sequence[Sequence[str]], started: float,
                   e: BaseException) -> None:
        """Stop every unfinished job (SIGTERM, then SIGKILL after GRACE_S or at a second signal), record
        those that could not record themselves as interrupted, and write the sweep's summary."""
        from sarathi_lab.harness.interrupts import deferred_signals

        log.error("interrupted by %s: stopping the sweep's %d jobs", e, len(jobs))
        # A second Ctrl-C (an impatient user) cuts the grace short, never this stopping itself.
        with deferred_signals(signal.SIGINT, signal.SIGTERM, raise_at_end=False) as again:
            live = [job for job in jobs if not job.done()]
            for job in live:
                _signal_job(job, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_S
            while any(not job.done() for job in live) and time.monotonic() < deadline and not again:
                time.sleep(0.2)
            for job in live:
                if not job.done():
                    _signal_job(job, signal.SIGKILL)
            self._record_stopped(jobs, nums, job_overrides, started, e)

    def _record_stopped(self, jobs: list, nums: list[int], job_overrides: Sequence[Sequence[str]], started: float,
                        e: BaseException) -> None:
        """Each job that could not record itself recorded interrupted, and the sweep's summary."""
        from sarathi_lab.harness.results import (
            METRICS,
            SWEEP_SUMMARY,
            is_finished,
            next_dir,
            read_status,
            write_json,
            write_status,
        )
        from sarathi_lab.harness.sweep import summarize_sweep

        for job, num, overrides in zip(jobs, nums, job_overrides):
            job_dir = self._job_dir(num, overrides, job.job_id)
            if is_finished(job_dir) and (job_dir / METRICS).stat().st_mtime < started - 1:
                job_dir = next_dir(job_dir)
            status = read_status(job_dir)
            if status is None or status["time"] < started - 1 or status["status"] == "running":
                job_dir.mkdir(parents=True, exist_ok=True)
                write_status(job_dir, "interrupted", error=f"the sweep was interrupted by {e}")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        write_json(sweep_dir / SWEEP_SUMMARY, summarize_sweep(sweep_dir, since=started))
        log.error("sweep %s interrupted; its jobs stopped, summary in %s", sweep_dir, sweep_dir / SWEEP_SUMMARY)

    def _collect(self, job: Any, num: int, overrides: Sequence[str], started: float) -> JobReturn:
        from submitit.core.utils import FailedJobError, UncompletedJobError

        from sarathi_lab.harness.results import (
            METRICS,
            STATUS,
            is_finished,
            next_dir,
            read_status,
            write_status,
        )

        try:
            return job.results()[0]
        except UncompletedJobError as e:
            error = e
        job_dir = self._job_dir(num, overrides, job.job_id)
        if is_finished(job_dir) and (job_dir / METRICS).stat().st_mtime < started - 1:
            # A finished run of an earlier sweep, which the job's rerun had to leave as it was: the
            # rerun recorded itself beside it (runner.claim_status_dir), and so is its death.
            job_dir = next_dir(job_dir)
        status = read_status(job_dir)
        if status is None or status["time"] < started - 1 or status["status"] == "running":
            job_dir.mkdir(parents=True, exist_ok=True)  # it may have died before Hydra made it
            if isinstance(error, FailedJobError):  # raised in Hydra or submitit, outside run.py's handler
                write_status(job_dir, "failed", error=_last_traceback_line(str(error)), traceback=str(error))
            else:
                why = "killed by SIGKILL (the OOM killer, kill -9, a hard limit) or crashed"
                if self._EXECUTOR == "slurm":  # which Slurm knows: OUT_OF_MEMORY, TIMEOUT, CANCELLED...
                    why += f" (Slurm state {job.state})"
                write_status(job_dir, "killed", error=f"the job's process died without returning: {why}")
        log.warning("job #%d did not return; %s says why", num, job_dir / STATUS)
        # Hydra's sweeper re-raises a FAILED JobReturn before on_multirun_end, which would skip
        # SweepSummary: like a job that raises (run.py), this one returns and status.json tells.
        return JobReturn(overrides=list(overrides), working_dir=str(job_dir), status=JobStatus.COMPLETED)

    def _job_dir(self, num: int, overrides: Sequence[str], job_id: str) -> Path:
        # Where the job's own __call__ and run_job put it.
        assert self.hydra_context is not None and self.config is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id, cfg.hydra.job.num = job_id, num
        return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


def _signal_job(job: Any, signum: int) -> None:
    """signum to a local job's processes (its controller forwards SIGTERM to the run; SIGKILL goes
    to the run too, which the controller's death would leave orphaned), or Slurm's cancel."""
    process = getattr(job, "_process", None)
    try:
        if process is None:
            job.cancel(check=False)
            return
        pids = [process.pid]
        if signum == signal.SIGKILL:
            pids = _children(process.pid) + pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    except (OSError, RuntimeError) as err:
        log.warning("could not stop job %s: %s", job.job_id, err)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _last_traceback_line(message: str) -> str:
    # submitit's message: a header, the traceback between two rules of dashes, then where the logs are.
    parts = message.split("-" * 22)
    lines = (parts[1] if len(parts) > 2 else message).strip().splitlines()
    return lines[-1] if lines else "the job raised"


class LocalLauncher(_CollectEveryJob, plugin.LocalLauncher):
    pass


class SlurmLauncher(_CollectEveryJob, plugin.SlurmLauncher):
    pass
