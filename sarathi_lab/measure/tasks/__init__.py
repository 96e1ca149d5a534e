"""Measurements that are not serving runs, one module per task, each named in the harness's table
(``sarathi_lab.harness.tasks.TASKS``) and imported only when its task runs."""
