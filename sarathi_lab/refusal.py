"""A refused config value in one line: the core marks its field; the edge names it once."""
from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable
from typing import Any, Protocol


class Naming(Protocol):
    """config.Keys."""

    def render(self, text: str) -> str: ...


class ConfigError(ValueError):
    """``str`` writes the settings by their fields (LLM's keywords); ``named`` as an edge does."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.template = message
        lead = _SET.match(message)
        self.setting = setting or (lead[1] if lead else None)
        # The value as the user set it (its repr), then why, and what is allowed.
        self.value = lead[2] if lead else None
        self.why = message[lead.end():] if lead else message
        self.allowed = m[1] if (m := _ALLOWED.search(self.why)) else None

    def __str__(self) -> str:
        return as_written(self.template)

    def named(self, keys: Naming) -> ConfigError:
        """A copy: the class and fields kept."""
        named = copy.copy(self)
        named.template = keys.render(self.template)
        named.args = (named.template,)
        return named


# A core refusal's marks (a setting, a setting at a value), replaced by the user's key.
_NAME, _AT, _END = "\x1f", "\x1d", "\x1e"
_SET = re.compile(f"{_END}([^{_AT}]*){_AT}(.*?){_END}", re.DOTALL)
_NAMED = re.compile(f"{_NAME}([^{_NAME}]*){_NAME}")
_ALLOWED = re.compile(r"allowed(?: values are| here)?:? (.*)$", re.DOTALL)


def render(text: str, name: Callable[[str], str], at: Callable[[str, str], str]) -> str:
    return _NAMED.sub(lambda m: name(m[1]), _SET.sub(lambda m: at(m[1], m[2]), text))


def as_written(text: str) -> str:
    """Settings by their fields: LLM's keywords, and a log line of the core's."""
    return render(text, str, lambda setting, value: f"{setting}={value}")


class Setting:
    """How the core names a setting in a refusal: by its field, marked for the edge to rename."""

    def __call__(self, setting: str) -> str:
        return f"{_NAME}{setting}{_NAME}"

    def set(self, setting: str, value: Any) -> str:
        return f"{_END}{setting}{_AT}{value!r}{_END}"


SETTING = Setting()


@contextlib.contextmanager
def named_as(keys: Naming):
    try:
        yield
    except ConfigError as e:
        raise e.named(keys) from None


@contextlib.contextmanager
def marked_as(fields: dict[str, str]):
    """Each setting of a ConfigError raised inside marked as its field, for the edge to name."""

    try:
        yield
    except ConfigError as e:
        out = copy.copy(e)
        out.template = render(e.template, lambda s: SETTING(fields.get(s, s)),
                              lambda s, value: f"{_END}{fields.get(s, s)}{_AT}{value}{_END}")
        out.args, out.setting = (out.template,), e.setting and fields.get(e.setting, e.setting)
        raise out from None
