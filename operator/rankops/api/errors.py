"""Turn pydantic validation errors into messages that name the manifest field and the fix."""
from __future__ import annotations

from pydantic import ValidationError


def field_path(loc: tuple) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part).startswith(("function-", "literal[", "json-or")) or str(part)[:1].isupper():
            continue  # pydantic's validator and union-branch names are no use to a user
        else:
            path += ("." if path else "") + str(part)
    return path


def describe(exc: ValidationError, prefix: str = "") -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        if err["type"] == "literal_error" and not isinstance(err.get("input"), str):
            continue  # the other branch of a `word | object` union explains the real problem
        loc = field_path(tuple(err["loc"]))
        where = ".".join(p for p in (prefix, loc) if p)
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{where or '(object)'}: {message}")
    return sorted(set(lines), key=lines.index)
