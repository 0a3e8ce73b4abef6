"""Shared pydantic base for every API model: camelCase on the wire, snake_case in Python.

Models are frozen (a parsed spec is a value) and reject unknown fields, so a typo in a
manifest is an error naming the field rather than a silently ignored key.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


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
