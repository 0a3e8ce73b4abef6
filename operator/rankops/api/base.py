"""Shared pydantic base for every API model: camelCase on the wire, snake_case in Python.

Models are frozen (a parsed spec is a value) and reject unknown fields, so a typo in a
manifest is an error naming the field rather than a silently ignored key.
"""
from __future__ import annotations

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


def refuse_unquoted_version(model: type[BaseModel], value: Any, field_name: str, example: str) -> Any:
    """A version field (a `field_validator(mode="before")`'s value) that YAML read as a number is an
    error naming the field: unquoted, 12.10 is the number 12.1, and no version check can undo that."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        field = model.model_fields[field_name]
        major = example.split(".")[0]
        raise ValueError(f"{field.alias or field_name} must be a quoted string such as \"{example}\": unquoted, "
                         f"YAML reads it as the number {value!r} ({major}.10 would become {major}.1)")
    return value


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        extra="forbid",
    )

    def to_wire(self) -> dict:
        """The object as it appears in a manifest (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def known_fields(cls, data: Any, path: str = "") -> tuple[Any, list[str]]:
        """`data` (wire form) without the keys this model does not know, and without the values of
        its enum fields that it does not know (a newer rankops' new phase), and what was dropped: the
        path of a key, "path=value" of a value. What a newer rankops wrote into a stored status is
        dropped and said, not a ValidationError on every reconcile. Other values are not checked
        here; a field typed `dict[str, Any]` keeps its keys. A required enum field whose value is
        dropped leaves its object invalid: the caller decides what stands in for it."""
        if not isinstance(data, dict):
            return data, []
        fields = {(f.alias or name): f for name, f in cls.model_fields.items()}
        kept, dropped = {}, []
        for key, value in data.items():
            where = f"{path}.{key}" if path else key
            field = fields.get(key)
            if field is None:
                dropped.append(where)
                continue
            known, inner = _known(field.annotation, value, where)
            dropped += inner
            if known is not _DROPPED:
                kept[key] = known
        return kept, dropped

    @classmethod
    def from_stored(cls, data: Any) -> tuple[Any, list[str]]:
        """The model of `data` as stored (a status a newer rankops, or a hand, wrote), and what was
        dropped: unknown keys and enum values (known_fields), then the top-level fields whose value
        does not validate, each said as "path=invalid". Never a ValidationError for what a field
        holds: the next reconcile decides a dropped field anew."""
        kept, dropped = cls.known_fields(data if isinstance(data, dict) else {})
        return cls.validated_dropping(kept, dropped)

    @classmethod
    def validated_dropping(cls, kept: dict[str, Any], dropped: list[str]) -> tuple[Any, list[str]]:
        """The model of `kept`, less the top-level fields that do not validate (added to `dropped`)."""
        while True:
            try:
                return cls.model_validate(kept), dropped
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]} & set(kept)
                if not bad:
                    raise
                kept = {k: v for k, v in kept.items() if k not in bad}
                dropped = dropped + [f"{k}=invalid" for k in sorted(bad)]


def unknown_fields_message(paths: list[str]) -> str:
    """What from_stored (or model_status.known_status) dropped, said once: fields by their path, values as "path=value"."""
    shown = ", ".join(f"status.{p}" for p in paths[:8]) + (f" and {len(paths) - 8} more" if len(paths) > 8 else "")
    return (f"{len(paths)} status field(s) or value(s) this operator does not know (or that do not validate) "
            f"were dropped: {shown} "
            "(written by a newer rankops? this one goes on without them)")


_DROPPED = object()   # an enum value this operator does not know: its key (or list item) goes


def _enum_of(annotation: Any) -> type[enum.Enum] | None:
    """The Enum a field typed `annotation` takes (`E`, `E | None`, `Annotated[E, ...]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        enums = [e for e in map(_enum_of, typing.get_args(annotation)) if e is not None]
        return enums[0] if len(enums) == 1 else None
    return None


def _known(annotation: Any, value: Any, path: str) -> tuple[Any, list[str]]:
    """`value` of a field typed `annotation` with unknown keys of its models dropped (_DROPPED: an
    enum value this operator does not know)."""
    known_enum = _enum_of(annotation)
    if known_enum is not None and value is not None:
        if any(value == m.value for m in known_enum):
            return value, []
        return _DROPPED, [f"{path}={value}"]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        models = [a for a in args if isinstance(a, type) and issubclass(a, ApiModel)]
        if len(models) == 1 and isinstance(value, dict):
            return models[0].known_fields(value, path)
        lists = [a for a in args if typing.get_origin(a) is list]
        if lists and isinstance(value, list):
            return _known(lists[0], value, path)
        return value, []
    if origin is list and args and isinstance(value, list):
        cleaned, dropped = [], []
        for i, item in enumerate(value):
            kept, inner = _known(args[0], item, f"{path}[{i}]")
            if kept is not _DROPPED:
                cleaned.append(kept)
            dropped += inner
        return cleaned, dropped
    if isinstance(annotation, type) and issubclass(annotation, ApiModel) and isinstance(value, dict):
        return annotation.known_fields(value, path)
    return value, []
