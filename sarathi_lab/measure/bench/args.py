"""The benchmarks' argument types, refused at parsing in one line. No heavy imports: every
``--help`` reads these."""
from __future__ import annotations

import argparse
from pathlib import PurePath

from sarathi_lab import cli_args
from sarathi_lab.host_features import usable_cores

TABLE_SUFFIXES = (".csv", ".json")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help but a flag's (``(default: True)`` misleads)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        plain = action.nargs == 0 or action.default is None
        return action.help if plain else super()._get_help_string(action)


def bench_parser(name: str, doc: str) -> cli_args.Parser:
    """``python -m sarathi_lab.measure NAME``'s, described by its docstring's first paragraph."""
    return cli_args.Parser(prog=f"python -m sarathi_lab.measure {name}",
                           description=doc.split("\n\n")[0],
                           formatter_class=HelpFormatter)


def _positive(convert, allowed: str):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be {allowed}")
        return value
    return parse


positive_int = _positive(int, "an integer >= 1")
positive_float = _positive(float, "a finite number > 0")


def comma_list(item, allowed: str, empty: bool = True):
    """``empty``: '' is none; one bad item refuses the list."""
    def parse(text: str) -> list:
        try:
            values = [item(x) for x in text.split(",") if x]
        except (argparse.ArgumentTypeError, ValueError):
            values = None
        if values is None or not (values or empty):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be a comma list of "
                                             f"{allowed}")
        return values
    # '' is a list of none here, not a value naming nothing (cli_args.Parser)
    parse.empty_ok = empty
    return parse


def _pair(text: str) -> tuple[int, int]:
    chunk, decodes = map(positive_int, text.split("+"))
    return chunk, decodes


positive_ints = comma_list(positive_int, "integers >= 1")
# '256+8,512+8' -> [(256, 8), (512, 8)]: a prefill chunk of 256 tokens with 8 decodes.
hybrid_pairs = comma_list(_pair, "CHUNK+DECODES, integers >= 1")


def thread_count(text: str) -> int:
    """At most the cores this process may run on: more would time their waits for a core."""
    value = positive_int(text)
    cores = usable_cores()
    if value > cores:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: this process may run on {cores} "
                                         f"cores, so at most {cores} threads")
    return value


def names_of(allowed: tuple[str, ...]):
    return comma_list(lambda name: allowed[allowed.index(name)], ", ".join(allowed), empty=False)


def int_range(text: str) -> tuple[int, int]:
    """'16-48' -> (16, 48), '32' -> (32, 32): bounds of a uniform draw, 1 <= LO <= HI."""
    lo, _, hi = text.partition("-")
    try:
        bounds = positive_int(lo), positive_int(hi or lo)
    except argparse.ArgumentTypeError:
        bounds = (1, 0)
    if bounds[0] > bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must be LO-HI (or N) with integers "
                                         f"1 <= LO <= HI")
    return bounds


def table_path(text: str) -> str:
    if PurePath(text).suffix not in TABLE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: must end in "
                                         f"{' or '.join(TABLE_SUFFIXES)}")
    return text
