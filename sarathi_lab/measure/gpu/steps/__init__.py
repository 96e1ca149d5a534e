"""One module per kind of step, each with ``run(ctx, step) -> (metrics, notes)``."""
