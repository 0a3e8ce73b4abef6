"""YAML output that people can read: multi-line strings (config.pbtxt) as literal blocks."""
from __future__ import annotations

from typing import Any, Iterable

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
# A StrEnum member (api.phases: a phase, a reason) is written as its string.
_Dumper.add_multi_representer(str, lambda dumper, value: _str(dumper, str(value)))


def dump_all(docs: Iterable[Any]) -> str:
    return yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, width=120)


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)
