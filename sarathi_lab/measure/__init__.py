"""Measurement: what times, profiles and checks the engine and the simulator, above both."""
# Its tasks registered with the harness wherever the wing is used, so that task=NAME runs it.
from sarathi_lab.measure import tasks  # noqa: F401
