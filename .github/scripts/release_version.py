"""The version a release tag publishes: the tag without its `v`, refused unless the package
(pyproject.toml) and the chart (Chart.yaml's appVersion) carry the same one, so the images pushed
under it are the ones the chart's and the CRDs' defaults name.

Usage (from the repository root): python .github/scripts/release_version.py v0.1.0  -> prints 0.1.0
"""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import yaml

PYPROJECT = "pyproject.toml"
CHART = "charts/rankops-operator/Chart.yaml"


class VersionMismatch(ValueError):
    """The tag names a version the repository's files do not carry."""


def release_version(tag: str, pyproject_text: str, chart_text: str) -> str:
    if not tag.startswith("v") or len(tag) == 1:
        raise VersionMismatch(f"release tags are v<version> (e.g. v0.1.0), not {tag!r}")
    version = tag[1:]
    found = {PYPROJECT: tomllib.loads(pyproject_text)["project"]["version"],
             f"{CHART} appVersion": str(yaml.safe_load(chart_text)["appVersion"])}
    differ = [f"{where} says {value}" for where, value in found.items() if value != version]
    if differ:
        raise VersionMismatch(f"tag {tag} releases {version}, but " + "; ".join(differ)
                              + ": bump them (and rankops/images.py's VERSION) in one commit, then tag it")
    return version


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    try:
        print(release_version(argv[1], (root / PYPROJECT).read_text(), (root / CHART).read_text()))
    except VersionMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
