"""One module per paper result, each defining ``RESULT`` (analysis/registry.py's PaperResult)."""
