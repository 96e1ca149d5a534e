"""Redraw the committed figures and claims table (docs/figures/) from result roots, in one command:

    python -m sarathi_lab.analysis.publish --measured outputs --sim outputs/sim --sim outputs/sim-roofline

Each paper result's ``<name>.png`` from the measured root and ``<name>_sim.png`` from the first
simulated one; the claims table from all of them, then the capacity rows and figures from
docs/capacity/. A figure whose runs the roots lack is left as it is.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from sarathi_lab import cli_args
from sarathi_lab.analysis import capacity_docs, claims, figures, registry
from sarathi_lab.analysis.runs import load_results


def draw_all(results, docs: Path, suffix: str = "") -> list[Path]:
    written = []
    for result in registry.RESULTS:
        if result.name in results.missing():
            continue
        fig = registry.draw(result, results)
        if fig is None:  # every run of it left out as unreliable: say so, keep the committed one
            print(f"{result.name}: no figure drawn: {results.unreliable_note(result.name)}")
            continue
        path = figures.save(fig, docs, result.name + suffix)
        plt.close(fig)
        written.append(path)
    return written


def publish(measured: str | Path | None, simulated: list[str | Path], docs: str | Path = capacity_docs.DOCS,
            include_unreliable: bool = False) -> list[Path]:
    docs, sims, written = Path(docs), [load_results(root) for root in simulated], []
    if measured is not None:
        runs = load_results(measured, include_unreliable=include_unreliable)
        written += draw_all(runs, docs)
        path = docs / "figures" / "claims.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        claims.claims_table(runs, sims).to_csv(path, index=False)  # its capacity rows: refresh's, below
    if sims:
        written += draw_all(sims[0], docs, "_sim")
    return written + capacity_docs.refresh(docs)


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.Parser(prog="python -m sarathi_lab.analysis.publish", description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", help="a produce root of measured runs (default: none redrawn)")
    parser.add_argument("--sim", action="append", default=[], help="a produce --sim root (repeatable)")
    parser.add_argument("--docs", default=capacity_docs.DOCS, type=Path, help="the docs folder")
    parser.add_argument("--include-unreliable", action="store_true", help="keep runs flagged timing_unreliable")
    args = parser.parse_args(argv)
    for root in filter(None, [args.measured, *args.sim]):
        if not Path(root).is_dir():
            parser.error(f"root {root!r} is invalid: no such directory")
    if args.measured is None and not args.sim:
        parser.error("nothing to publish: give --measured ROOT and/or --sim ROOT")
    print("\n".join(map(str, publish(args.measured, args.sim, args.docs, args.include_unreliable))))


if __name__ == "__main__":
    main()
