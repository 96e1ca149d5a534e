"""The project's command-line parser: a refusal is one line and exit 2, as ``python -m sarathi_lab.run``
gives one (harness/cli_check.py), instead of argparse's usage block. ``--help`` still prints the
whole usage. Standard library only: every CLI's ``--help`` imports this."""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        refuse(message)


def refuse(message: str) -> NoReturn:
    """A refusal outside a parser (a bad value found after parsing), in the same one-line format; one
    line whatever the message holds (a path or a value may carry a newline)."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)
