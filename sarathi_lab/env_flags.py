"""The one reading of a yes/no environment variable (``SARATHI_INCLUDE_INCOMPLETE=true``): the usual
spellings either way, any other value refused in one line rather than read as "no" without a word.
Standard library only: readers of every layer import it."""
from __future__ import annotations

import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class EnvFlagError(ValueError):
    """A variable set to neither yes nor no; the message is one line."""


def parse_flag(name: str, value: str) -> bool:
    """TRUE or FALSE in any case, surrounding blanks ignored."""
    spelled = value.strip().lower()
    if spelled in TRUE:
        return True
    if spelled in FALSE:
        return False
    shown = " ".join(value.split())[:80]
    raise EnvFlagError(f"{name}={shown!r} is invalid: must be one of {', '.join(TRUE)} (yes) "
                       f"or {', '.join(FALSE)} (no), or unset")


def env_flag(name: str, default: bool = False) -> bool:
    """``default`` where unset or empty (as a shell's ``NAME=`` leaves it)."""

    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return parse_flag(name, value)
