"""From the experiments' runs to the paper's figures: derivations (derive), the papers' numbers
(paper), the claims table (claims), plots (figures), and finding or producing the runs (runs)."""
