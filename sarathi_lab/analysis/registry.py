"""The paper's results, each a module in ``analysis/paper_results/`` registering ``RESULT``."""
from __future__ import annotations

import importlib
import pkgutil

from sarathi_lab.analysis import paper_results
from sarathi_lab.analysis.paper_result import PaperResult


def _discover() -> tuple[PaperResult, ...]:
    modules = [importlib.import_module(f"{paper_results.__name__}.{info.name}")
               for info in pkgutil.iter_modules(paper_results.__path__)]
    found = [m.RESULT for m in modules if isinstance(getattr(m, "RESULT", None), PaperResult)]
    names = [r.name for r in found]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"analysis/paper_results: {twice[0]!r} is registered twice; each result's "
                         "name must be unique")
    return tuple(sorted(found, key=lambda r: (r.order, r.name)))


# Read when used, so a result registered later (a test's toy) is seen.
RESULTS: tuple[PaperResult, ...] = _discover()


def names() -> tuple[str, ...]:
    return tuple(r.name for r in RESULTS)


def by_name(name: str) -> PaperResult:
    for result in RESULTS:
        if result.name == name:
            return result
    raise KeyError(f"{name!r} is no paper result; known: {', '.join(names())}")


def draw(result: PaperResult, runs, simulated=None):
    """The result's figure; measured runs all left out: the simulated alone, and why. None: none."""
    if not runs.summary(result.name).empty:
        return result.figure(runs, simulated)
    if (simulated is None or result.name in simulated.missing()
            or simulated.summary(result.name).empty):
        return None
    fig = result.figure(simulated, None)
    # In the headline: below the axes it ran into some figures' notes.
    above = fig._suptitle.get_text() + "\n" if fig._suptitle is not None else ""
    fig.suptitle(f"{above}measured runs left out: {runs.nothing_kept_note(result.name)}",
                 fontsize=11)
    return fig
