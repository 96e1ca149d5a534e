"""A refused config value in one line, held as fields: the core names each setting by its field,
the edge names it once as the user wrote it."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol


class Naming(Protocol):
    """config.Keys: how an edge writes a setting, and a value as the user set it."""

    def __call__(self, setting: str) -> str: ...

    def show(self, setting: str, value: Any) -> str: ...


class _AsWritten:
    """Settings by their fields: LLM's keywords, a log line of the core's, and a key an edge
    wrote itself."""

    def __call__(self, setting: str) -> str:
        return setting

    def show(self, setting: str, value: Any) -> str:
        return repr(value)


AS_WRITTEN = _AsWritten()


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"  # the one UNSET, in another process too


UNSET: Any = _Unset()  # a setting named without its value


class Written(str):
    """A value shown as written (``token_budget=auto``, ``=???``), not as its repr."""

    def __repr__(self) -> str:
        return str(self)


class _Joins:
    """Joined to text by ``+`` only: an f-string would write the field and lose the edge's name."""

    def __add__(self, other: Text | Key | str) -> Text:
        return Text(_parts(self) + _parts(other))

    def __radd__(self, other: str) -> Text:
        return Text(_parts(other) + _parts(self))

    def __format__(self, spec: str) -> str:
        raise TypeError(f"{self!r} joins a refusal's text by +, so that the edge can name it")

    def __str__(self) -> str:
        return self.written(AS_WRITTEN)


@dataclass(frozen=True)
class Key(_Joins):
    """A setting named in a refusal's text, ``setting=value`` where it has a value."""
    setting: str
    value: Any = UNSET

    def written(self, keys: Naming) -> str:
        name = keys(self.setting)
        return name if self.value is UNSET else f"{name}={keys.show(self.setting, self.value)}"

    def renamed(self, fields: Mapping[str, str]) -> Key:
        return replace(self, setting=fields.get(self.setting, self.setting))


@dataclass(frozen=True)
class Text(_Joins):
    """Words and the settings they name, which the edge writes as the user's keys."""
    parts: tuple[str | Key, ...]

    def written(self, keys: Naming) -> str:
        return "".join(p if isinstance(p, str) else p.written(keys) for p in self.parts)

    def renamed(self, fields: Mapping[str, str]) -> Text:
        return Text(tuple(p if isinstance(p, str) else p.renamed(fields) for p in self.parts))


Words = str | Key | Text


def _parts(words: Words) -> tuple[str | Key, ...]:
    if isinstance(words, Text):
        return words.parts
    if isinstance(words, (str, Key)):
        return (words,)
    return NotImplemented


def written(words: Words | None, keys: Naming = AS_WRITTEN) -> str:
    return words if isinstance(words, str) or words is None else words.written(keys)


def _renamed(words: Words | None, fields: Mapping[str, str]) -> Words | None:
    return words if isinstance(words, str) or words is None else words.renamed(fields)


@dataclass(eq=False)
class ConfigError(ValueError):
    """``setting=value why; allowed: allowed`` (``setting: why`` where why starts with a colon).

    ``setting`` is a field of the core's (an engine setting, a scheduler's knob) until an edge names
    it by ``keys``; an edge that writes the user's key itself passes its ``keys`` (AS_WRITTEN for a
    key as written), so that no later edge renames it. None: no one setting is refused."""
    setting: str | None
    value: Any = UNSET
    why: Words = ""
    allowed: Words | None = None
    keys: Naming | None = None

    def __post_init__(self):
        super().__init__(self.setting, self.value, self.why, self.allowed, self.keys)

    def __str__(self) -> str:
        keys = self.keys or AS_WRITTEN
        head = "" if self.setting is None else Key(self.setting, self.value).written(keys)
        why = written(self.why, keys)
        gap = " " if head and why and not why.startswith(":") else ""
        allowed = "" if self.allowed is None else f"; allowed: {written(self.allowed, keys)}"
        return f"{head}{gap}{why}{allowed}"

    @property
    def key(self) -> str | None:
        """The setting as the user wrote it (by its field until an edge names it)."""
        return None if self.setting is None else (self.keys or AS_WRITTEN)(self.setting)

    def named(self, keys: Naming) -> ConfigError:
        """A copy named by ``keys``, the class kept; one an edge named already is kept as it is."""
        return self if self.keys is not None else replace(self, keys=keys)

    def marked(self, fields: Mapping[str, str]) -> ConfigError:
        """A copy whose settings are ``fields``' (another field of the same setting)."""
        if self.keys is not None:
            return self
        setting = self.setting and fields.get(self.setting, self.setting)
        return replace(self, setting=setting, why=_renamed(self.why, fields),
                       allowed=_renamed(self.allowed, fields))


@contextlib.contextmanager
def named_as(keys: Naming):
    """The edge: a ConfigError raised inside names its settings by ``keys``."""
    try:
        yield
    except ConfigError as e:
        raise e.named(keys) from None


@contextlib.contextmanager
def marked_as(fields: dict[str, str]):
    """Each setting of a ConfigError raised inside taken as its field in ``fields``."""
    try:
        yield
    except ConfigError as e:
        raise e.marked(fields) from None
