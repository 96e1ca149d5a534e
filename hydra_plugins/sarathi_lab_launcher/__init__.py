"""sarathi_lab's Hydra plugins: submitit launchers that survive killed jobs (submitit_launcher.py), and the
basic sweeper that runs once the jobs only an ignored key sets apart (sweeper.py)."""
