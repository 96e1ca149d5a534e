"""sarathi_lab's Hydra plugins: submitit launchers that survive killed jobs (submitit_launcher.py), the
basic sweeper that runs once the jobs only an ignored key sets apart (sweeper.py), and the config source
serving an experiment's variants from the sections of its one file (experiment_source.py)."""
