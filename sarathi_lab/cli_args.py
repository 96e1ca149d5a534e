"""The command-line parser: a refusal is one line, exit 2; stdlib only: every --help loads it."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        refuse(message)

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        # An empty value names nothing (type=Path makes '' the working directory): refused before
        # a type turns it into something, unless the type has ``empty_ok`` ('' means none).
        takes_value = {o: a for a in self._actions
                       if a.nargs != 0 and not getattr(a.type, "empty_ok", False)
                       for o in a.option_strings}
        for i, arg in enumerate(args):
            option, eq, value = arg.partition("=")
            given = value if eq else (args[i + 1] if i + 1 < len(args) else None)
            if option in takes_value and given == "":
                self.error(f"{takes_value[option].option_strings[-1]}='' is invalid: an empty "
                           "value names nothing; give one, or leave the option out for its default")
        return super().parse_known_args(args, namespace)


def refuse(message: str) -> NoReturn:
    """One line whatever the message holds (a path or a value may carry a newline)."""

    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


def shared(parser: argparse.ArgumentParser, *, smoke: str | None = None, out: str | None = None,
           force: str | None = None, out_type=Path, out_default=None) -> None:
    """The options the commands share, declared here once: each given its command's help (what
    --smoke shrinks, where --out writes, what --force replaces); one left None is not an option."""
    if smoke is not None:
        parser.add_argument("--smoke", action="store_true", help=smoke)
    if out is not None:
        parser.add_argument("--out", type=out_type, default=out_default, help=out)
    if force is not None:
        parser.add_argument("--force", action="store_true", help=force)
