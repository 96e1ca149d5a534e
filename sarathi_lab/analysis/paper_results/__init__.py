"""One module per paper result: its ``claims``, ``figure`` and ``RESULT`` (registry.PaperResult)."""
