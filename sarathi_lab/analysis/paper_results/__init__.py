"""One module per paper result: its claim check (``claims``), its figure (``figure``) and its
``RESULT`` (analysis/registry.py's PaperResult) that registers both with its experiment and GPU run.
"""
