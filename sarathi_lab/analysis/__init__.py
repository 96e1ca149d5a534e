"""From the experiments' runs to the paper's figures: derivations (derive), the papers' numbers
(paper), the claims table (claims), plots (figures), and finding the runs (runs). Reads result files
only: ``python -m sarathi_lab.produce`` runs the experiments."""
