"""What ``LLM.generate`` accepts, as plain Python values, or an error naming the position."""
from __future__ import annotations

import math
import numbers
from typing import Any


def _describe(value: Any) -> str:
    kind = type(value).__name__
    dtype = getattr(value, "dtype", None)
    return f"{kind} of {dtype}" if dtype is not None else kind


def _is_int(value: Any) -> bool:
    # numbers.Integral covers int and numpy integers; bool (and numpy.bool_) is not a token id.
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and type(value).__name__ != "bool_")


def _as_list(value: Any, integer: bool = True) -> list | None:
    """A 1-level list (a list itself: the engine copies a prompt); None for no sequence."""
    if isinstance(value, list):
        return value
    if isinstance(value, (tuple, range)):
        return list(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "ndim", 0) >= 1:
        dtype = str(getattr(value, "dtype", ""))
        # Integer arrays only (a float array is refused whole).
        if not integer or ("int" in dtype and "bool" not in dtype):
            return tolist()
        raise TypeError(f"token ids must be integers; got a {_describe(value)}")
    return None


def prompts_as_lists(prompts: Any) -> list[list[int]]:
    items = _as_list(prompts)
    if items is None or isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a sequence of token-id sequences; "
                        f"got {_describe(prompts)}")
    if items and all(_is_int(p) for p in items):
        raise TypeError("prompts must be a sequence of token-id sequences; got one flat sequence "
                        "of ints (wrap a single prompt in a list: generate([prompt]))")
    out = []
    for i, prompt in enumerate(items):
        tokens = _as_list(prompt)
        if tokens is None or isinstance(prompt, (str, bytes)):
            raise TypeError(f"prompts[{i}] must be a sequence of token ids; "
                            f"got {_describe(prompt)}")

        if set(map(type, tokens)) == {int}:  # the common case, without the slow ABC check, in C
            out.append(tokens)
            continue
        if (bad := next((t for t in tokens if not _is_int(t)), None)) is not None:
            raise TypeError(f"prompts[{i}] holds {bad!r} ({type(bad).__name__}); "
                            "token ids must be integers")
        out.append([int(t) for t in tokens])
    return out


def per_request_ints(name: str, value: Any, n: int) -> list[int]:
    if _is_int(value):
        values = [int(value)] * n
    else:
        items = _as_list(value)
        if items is None:
            raise TypeError(f"{name} must be an int or a sequence of ints; got {_describe(value)}")
        if len(items) != n:
            raise ValueError(f"{name} has {len(items)} values for {n} prompts")
        if (bad := next((v for v in items if not _is_int(v)), None)) is not None:
            raise TypeError(f"{name} holds {bad!r} ({type(bad).__name__}); must be ints")
        values = [int(v) for v in items]
    if (bad := next((v for v in values if v < 1), None)) is not None:
        raise ValueError(f"{name}={bad} is invalid: must be >= 1")
    return values


# The latest arrival a run waits for: a day; compress longer traces with workload.time_scale.
ARRIVAL_HORIZON_S = 86_400.0


def arrival_list(value: Any, n: int) -> list[float]:
    items = _as_list(value, integer=False)
    if items is None:
        raise TypeError(f"arrival_times must be a sequence of numbers; got {_describe(value)}")
    if len(items) != n:
        raise ValueError(f"arrival_times has {len(items)} values for {n} prompts")
    out = []
    for i, t in enumerate(items):
        if isinstance(t, bool) or not isinstance(t, numbers.Real):
            raise TypeError(f"arrival_times[{i}]={t!r} is invalid: must be a number")
        if not (math.isfinite(t) and 0 <= t <= ARRIVAL_HORIZON_S):
            raise ValueError(f"arrival_times[{i}]={t!r} is invalid: must be in "
                             f"[0, {ARRIVAL_HORIZON_S:g}] s (a run waits for its arrivals)")

        out.append(float(t))
    return out
