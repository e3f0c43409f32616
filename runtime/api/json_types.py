"""The building blocks of the request models (`protocol`, `protocol_sglang`): strict JSON types,
integral floats taken as integers, unions that fail with one message, unknown fields refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError


def _integral(value: Any) -> Any:
    """`5.0` -> 5 (JSON has one number type; JSON Schema counts 5.0 as an integer)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_integral)]


def IntRange(ge: int | None = None, le: int | None = None) -> Any:  # noqa: N802 (a type, named as one)
    """`Int` within [ge, le]. Use it, not `Int | None = Field(ge=...)`: on a union pydantic writes
    that bound into the JSON schema as an unknown `ge` keyword (so the document did not say it);
    here it is `minimum` / `maximum`."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]
TokenId = Annotated[Int, Field(json_schema_extra={"minimum": 0})]  # the range is checked against the vocabulary


def either(kind: Any, expected: str) -> Any:
    """`kind` (a union) validated as one: a value that fits no member gets one error, "must be
    `expected`", at the field itself rather than one per member."""

    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("either", "must be {expected}", {"expected": expected}) from None

    return Annotated[kind, WrapValidator(check)]


class Strict(BaseModel):
    """A request body: JSON types as sent, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)
