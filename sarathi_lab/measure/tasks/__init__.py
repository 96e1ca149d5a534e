"""Measurements that are not serving runs, one module per task (adding one adds the task), each
registered with the harness (``sarathi_lab.harness.tasks``) and imported only when its task runs."""
from __future__ import annotations

import importlib
import pkgutil
from functools import partial

from sarathi_lab.harness.tasks import register

for _task in pkgutil.iter_modules(__path__):
    if not _task.name.startswith("_"):
        register(_task.name, partial(importlib.import_module, f"{__name__}.{_task.name}"))
