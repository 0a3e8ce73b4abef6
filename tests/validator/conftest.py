"""Fixtures for the node validator tests: host trees built from tests/validator/hosts/trees.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("validator_host_trees", Path(__file__).parent / "hosts" / "trees.py")
trees = importlib.util.module_from_spec(_spec)
sys.modules["validator_host_trees"] = trees  # test modules import it by this name
_spec.loader.exec_module(trees)


@pytest.fixture
def build_host(tmp_path):
    """build_host(scenario, overrides={...}) -> path of a fresh host root."""
    counter = iter(range(1000))

    def build(scenario: str = "healthy-rhel89", overrides: dict | None = None) -> Path:
        root = trees.build(scenario, tmp_path / f"host{next(counter)}")
        for relative, content in (overrides or {}).items():
            trees._write(root, relative, content)
        return root

    return build
