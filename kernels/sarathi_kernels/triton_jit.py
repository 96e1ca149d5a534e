"""``jit``: our Triton kernels compiled on CUDA, or run by Triton's interpreter without it, whatever
imported Triton first and whatever the environment says.

``triton.jit`` picks interpreter or compiler from ``TRITON_INTERPRET`` when a function is decorated,
and triton.language's own ``@jit`` helpers (``tl.sum``, ``tl.max``, ``tl.zeros``...) were decorated
when Triton was first imported, usually by torch or transformers long before anyone asks for
``attention=triton``. So no variable set by us can arrive in time. Instead, without CUDA, our
kernels are wrapped in the interpreter's function type explicitly, and triton.language's helpers
decorated for the compiler are replaced, once, by interpreted ones, and Triton's interpret knob is
set: the state Triton would be in had ``TRITON_INTERPRET=1`` been set before its import.
``TRITON_INTERPRET`` set explicitly (1 or 0) still decides, so that the compiled kernels can be built
for a GPU target on a machine without one.
"""
from __future__ import annotations

import os
import sys

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


def _interpret() -> bool:
    if "TRITON_INTERPRET" in os.environ:
        return triton.knobs.runtime.interpret
    return not torch.cuda.is_available()


INTERPRETED = _interpret()


def _interpret_triton_language() -> None:
    """Turn triton.language's compiler-mode ``@jit`` helpers into interpreted ones, as module
    globals (where interpreted code looks them up) and as tensor methods (``x.sum()``)."""
    # By id: hashing a JITFunction parses its source and its references.
    interpreted: dict[int, InterpretedFunction] = {}

    def swap(value: JITFunction) -> InterpretedFunction:
        if id(value) not in interpreted:
            interpreted[id(value)] = InterpretedFunction(value.fn)
        return interpreted[id(value)]

    modules = [m for name, m in list(sys.modules.items()) if name.startswith("triton.language") and m is not None]
    for module in modules:
        for name, value in list(vars(module).items()):
            if type(value) is JITFunction:
                setattr(module, name, swap(value))
    tensor = triton.language.tensor
    for name, value in list(vars(tensor).items()):
        if type(value) is JITFunction:
            setattr(tensor, name, _method(swap(value)))


def _method(fn: InterpretedFunction):
    """A plain function, so that ``x.sum(1)`` binds x as the first argument."""
    return lambda *args, **kwargs: fn(*args, **kwargs)


if INTERPRETED:
    _interpret_triton_language()
    # From here on the process is in the state TRITON_INTERPRET=1 at startup would have given it:
    # Triton's own checks (e.g. gluon's, on first specialisation) and later @jit decorations agree.
    # Triton exports the knob to the environment too, so child processes start interpreted.
    triton.knobs.runtime.interpret = True


def jit(fn=None, *, do_not_specialize: tuple[str, ...] = ()):
    """``triton.jit`` with the mode chosen above. ``do_not_specialize``: integer arguments that change
    from call to call (counts, a table's width): Triton otherwise compiles a version of the kernel for
    each of their classes (1, a multiple of 16, any other), so a new batch shape would stall mid-run."""
    if fn is None:
        return lambda f: jit(f, do_not_specialize=do_not_specialize)
    if INTERPRETED:
        return InterpretedFunction(fn)
    return triton.jit(fn, do_not_specialize=list(do_not_specialize) or None)
