"""A stand-in for analysis.runs.Results holding hand-made frames, for tests that judge a result's
claims (registry.CHECK) on tables they build."""
from __future__ import annotations

import pandas as pd


class Frames:
    def __init__(self, frames: dict[tuple[str, str], pd.DataFrame]):
        self.frames = frames

    def table(self, name, table):
        return self.frames[name, table]

    def summary(self, name):
        return self.frames[name, "summary"]

    def sweep_note(self, name):
        return ""  # a complete sweep, nothing passed over

    def unreliable_note(self, name):
        return ""  # no run flagged
