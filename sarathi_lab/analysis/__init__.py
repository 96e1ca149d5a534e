"""From the experiments' result files to the paper's figures and claims table (reading only)."""
