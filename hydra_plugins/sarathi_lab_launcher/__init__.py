"""sarathi_lab's Hydra plugins: submitit launchers that survive killed jobs (submitit_launcher.py)."""
