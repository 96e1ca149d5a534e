"""The simulator checked against the engine and against GPU measurements, in one place."""
