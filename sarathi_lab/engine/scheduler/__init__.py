"""Every module here is imported, registering its scheduler: a new scheduler is its own file."""
import importlib
import pkgutil

from sarathi_lab.engine.scheduler.base import (
    Scheduler,
    SchedulerConfig,
    knob_names,
    make_scheduler,
    register_scheduler,
    scheduler_class,
    scheduler_config,
    scheduler_names,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Scheduler", "SchedulerConfig", "knob_names", "make_scheduler", "register_scheduler",
           "scheduler_class", "scheduler_config", "scheduler_names"]
