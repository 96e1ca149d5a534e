"""Measurement: what times, profiles and checks the engine and the simulator, above both."""
