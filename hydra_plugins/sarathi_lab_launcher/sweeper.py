"""Hydra's basic sweeper (the cartesian product of the swept values, jobs numbered in its order), with
each job that differs from an earlier one only in keys it ignores left out: ``-m chunk=256,512
scheduler=vllm,sarathi`` runs sarathi twice and vllm, which reads no chunk, once. SweepPreflight
prints one line per key so collapsed (harness/sweep_check.py, collapse_ignored: what each scheduler
reads is its Config's fields). ``hydra.sweeper.repeat_ignored=true`` runs every job, as a paired
baseline beside each run of a sweep does (experiment=pd_ratio). ``hydra.sweeper.exclude``, a list of
``{key: value or [values]}``, leaves out the jobs that take those values of every key a rule names
(``- {scheduler: static, workload.stagger: 18}``): points of a product grid no reader needs.
Selected by conf/config.yaml (hydra/sweeper=sarathi); hydra/sweeper=basic is Hydra's own.

Hydra instantiates sweepers only from the hydra_plugins package: hence this location, and the
import of sarathi_lab (torch) inside the method.
"""
from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class Sweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None,
                 repeat_ignored: bool = False, exclude: list[Any] | None = None) -> None:
        super().__init__(max_batch_size, params)
        self.repeat_ignored = repeat_ignored
        self.exclude = exclude

    # BasicSweeper.sweep calls self.split_arguments(overrides, max_batch_size): the jobs in batches.
    def split_arguments(self, overrides: list[Any], max_batch_size: int | None) -> list[list[list[str]]]:
        from sarathi_lab.harness.sweep_check import without_excluded

        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        # Checked by SweepPreflight first, which refuses a malformed rule in one line.
        jobs, _ = without_excluded(self.exclude, jobs)
        if not self.repeat_ignored:
            from sarathi_lab.harness.sweep_check import collapse_ignored

            jobs, _ = collapse_ignored(self.config, jobs)  # its lines were printed by SweepPreflight
        if max_batch_size is None:
            return [jobs]
        return [list(batch) for batch in BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size)]

    # BasicSweeper.sweep composes each job before launching it, to fail early; under the basic launcher
    # the preflight (harness/sweep_check.py) has composed every job already, with the same loader.
    def validate_batch_is_legal(self, batch: list[list[str]]) -> None:
        from sarathi_lab.harness.sweep_check import composed

        loader = self.hydra_context.config_loader
        super().validate_batch_is_legal([job for job in batch if not composed(loader, job)])
