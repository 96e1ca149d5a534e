"""Set for the whole session before any test imports torch, and inherited by every process a test starts."""
import os

# The tests run on one pytest-xdist worker a core (pyproject's addopts), each process with torch's
# default threads. OpenMP threads that spin while they wait take the cores another worker needs, and
# every test of both slows down several times; sleeping ones cost a test little and change no result.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
