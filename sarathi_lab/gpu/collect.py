"""Unpack a GPU call's archive into what the repository keeps: docs/gpu/<device>/ (summary,
claims, step results, figures) and profiles/<device>/; never the raw run folders.

    python -m sarathi_lab.gpu.collect .gpu/suite.tar.gz
"""
from __future__ import annotations

import argparse
import json
import re
import tarfile
from pathlib import Path

from sarathi_lab.config import REPO_ROOT, device_slug

# Kept: small text tables and figures; never the per-run folders of the paper sweeps.
KEEP = re.compile(r"^(summary\.(json|csv)|claims\.csv|figures/[\w.-]+\.png|steps/[\w.-]+/[\w.-]+\.(json|csv|log|txt))$")
PROFILE = re.compile(r"^profiles/([\w.-]+)/([\w.-]+\.(csv|json))$")
ENV = "steps/env/env.json"  # names the device, hence where everything goes


def collect(archive: Path, root: Path = REPO_ROOT) -> list[Path]:
    """The files kept, written under ``root``; a ValueError, before writing any, for an archive
    that cannot say which device it measured or that a dry run made (tiny shapes on the CPU)."""
    written = []
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        if ENV not in names:
            raise ValueError(f"{archive} is invalid: it has no {ENV} (the env step has not finished), so the "
                             "device it measured is unknown")
        if "summary.json" in names and json.load(tar.extractfile("summary.json"))["suite"].get("dry_run"):
            raise ValueError(f"{archive} is invalid: a dry run's (tiny shapes on the CPU), not a GPU's measurements")
        device = device_slug(json.load(tar.extractfile(ENV))["device"])
        for member in tar.getmembers():
            if not member.isfile():
                continue
            if m := PROFILE.match(member.name):
                target = root / "profiles" / m[1] / m[2]
            elif KEEP.match(member.name):
                target = root / "docs" / "gpu" / device / member.name
            else:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sarathi_lab.gpu.collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", type=Path, help="suite.tar.gz as a GPU call brought it back")
    args = parser.parse_args(argv)
    try:
        written = collect(args.archive)
    except (OSError, tarfile.TarError, ValueError) as e:
        parser.error(str(e))
    for path in written:
        print(path.relative_to(REPO_ROOT))


if __name__ == "__main__":
    main()
