"""The GPU suite: everything the project measures on a lent GPU, in one resumable command.

    python -m sarathi_lab.gpu --plan        # the steps and their expected minutes
    python -m sarathi_lab.gpu --dry-run     # every step on the CPU at tiny shapes (CI runs this)
    python -m sarathi_lab.gpu               # on the GPU machine: see docs/gpu/README.md

plan (the steps), state (the out directory, resume, export to $OUT), worker (runs steps in one
process), steps/ (one module per kind of step), report (figures, claims), wheels (what the GPU
machine lacks).
"""
