"""The simulator checked against the engine and against GPU measurements, in one place; each
check a command of ``python -m sarathi_lab.measure`` (measure/commands.py)."""
