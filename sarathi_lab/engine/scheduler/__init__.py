"""Schedulers register themselves by name on import."""
from sarathi_lab.engine.scheduler import orca, sarathi, sarathi_serve, static, vllm  # noqa: F401
from sarathi_lab.engine.scheduler.base import (
    Scheduler,
    SchedulerConfig,
    make_scheduler,
    register_scheduler,
    scheduler_class,
    scheduler_names,
)

__all__ = ["Scheduler", "SchedulerConfig", "make_scheduler", "register_scheduler", "scheduler_class",
           "scheduler_names"]
