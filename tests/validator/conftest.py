"""Fixtures for the node validator tests: host trees from rankops_dev.sample_hosts."""
from __future__ import annotations

from pathlib import Path

import pytest

from rankops_dev import sample_hosts as trees


@pytest.fixture
def build_host(tmp_path):
    """build_host(scenario, overrides={...}) -> path of a fresh host root."""
    counter = iter(range(1000))

    def build(scenario: str = "healthy-rhel89", overrides: dict | None = None) -> Path:
        root = trees.build(scenario, tmp_path / f"host{next(counter)}")
        for relative, content in (overrides or {}).items():
            trees.write_entry(root, relative, content)
        return root

    return build
