"""Python types as JSON schemas, and typed outputs: `gen(name, json_schema=T)`.

`T` may be a pydantic model (pydantic is optional: only a program that uses one needs it), a
dataclass or a TypedDict. The gen is constrained by `T`'s JSON schema, `s[name]` becomes a
validated instance of `T` (a dict for a TypedDict), and `s.get_meta_info(name)["raw_text"]`
keeps the text the model wrote (also what the program's text holds). Output that does not
validate (e.g. cut by max_tokens) raises `OutputValidationError`, which carries the raw text.

Schemas of dataclasses and TypedDicts come from their type hints: str/int/float/bool, None,
list[X]/tuple[X, ...], dict[str, X], Literal[...], Optional/Union, enums of plain values, and
nested dataclasses, TypedDicts and pydantic models. A field with a default is optional.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_SUPPORTED = "str, int, float, bool, list, dict, Literal, Optional, enums, dataclasses, TypedDicts, pydantic models"


class OutputValidationError(ValueError):
    """A typed gen's output did not parse or validate as its type."""

    def __init__(self, message: str, raw_text: str):
        super().__init__(message)
        self.raw_text = raw_text


def is_pydantic_model(hint: Any) -> bool:
    return isinstance(hint, type) and hasattr(hint, "model_json_schema") and hasattr(hint, "model_validate_json")


def is_output_type(spec: Any) -> bool:
    """True for what `gen(json_schema=...)` takes as a type (not a schema dict or JSON text)."""
    return is_pydantic_model(spec) or (dataclasses.is_dataclass(spec) and isinstance(spec, type)) or typing.is_typeddict(spec)


@dataclass(frozen=True)
class OutputType:
    """A type a gen's output is parsed into, and its JSON schema."""

    type_: Any
    schema: dict[str, Any]

    @classmethod
    def of(cls, type_: Any) -> OutputType:
        if not is_output_type(type_):
            raise TypeError(f"gen(json_schema=...): {type_!r} is not a pydantic model, a dataclass or a TypedDict "
                            "(or pass a JSON schema as a dict or JSON text)")
        return cls(type_, root_schema(type_, f"gen(json_schema={getattr(type_, '__name__', type_)})"))

    @property
    def name(self) -> str:
        return str(getattr(self.type_, "__name__", self.type_))

    def parse(self, text: str, finish_reason: Any = None) -> Any:
        """`text` as a validated instance; OutputValidationError saying why not."""
        hint = ""
        if isinstance(finish_reason, dict) and finish_reason.get("type") == "length":
            hint = " (generation stopped at max_tokens: raise it)"
        if is_pydantic_model(self.type_):
            try:
                return self.type_.model_validate_json(text)
            except ValueError as e:  # pydantic's ValidationError is a ValueError
                raise OutputValidationError(f"the output is not a valid {self.name}{hint}: {e}", text) from e
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise OutputValidationError(f"the output is not JSON{hint}: {e}: {text[:200]!r}", text) from e
        problem = schema_problem(value, self.schema)
        if problem is not None:
            raise OutputValidationError(f"the output is not a valid {self.name}{hint}: {problem}", text)
        return build(self.type_, value)


def root_schema(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of `hint`, with the definitions of nested pydantic models at its root."""
    defs: dict[str, Any] = {}
    schema = type_schema(hint, where, defs)
    if defs:
        schema["$defs"] = {**schema.get("$defs", {}), **defs}
    return schema


def type_schema(hint: Any, where: str, defs: dict[str, Any] | None = None, seen: tuple[Any, ...] = ()) -> dict[str, Any]:
    """The JSON schema of a type hint (see the module docstring); ValueError for what has none.
    `defs` collects nested pydantic models' definitions."""
    defs = {} if defs is None else defs
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is Any:
        return {}
    if hint in seen:
        raise ValueError(f"{where}: {hint!r} refers to itself; recursive types have no schema here")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        schemas = [type_schema(a, where, defs, seen) for a in options]
        if len(options) < len(args):
            schemas.append({"type": "null"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if hint in (list, tuple) or origin in (list, tuple):
        items = [a for a in args if a is not Ellipsis]
        return {"type": "array", "items": type_schema(items[0], where, defs, seen)} if items else {"type": "array"}
    if hint is dict or origin is dict:
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": type_schema(args[1], where, defs, seen)}
        return {"type": "object"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if is_pydantic_model(hint):
        schema = hint.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        return schema
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        required = {f.name for f in dataclasses.fields(hint)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        return _object_schema(hint, _hints(hint, where), required, where, defs, seen)
    if typing.is_typeddict(hint):
        return _object_schema(hint, _hints(hint, where), set(hint.__required_keys__), where, defs, seen)
    raise ValueError(f"{where}: cannot describe type {hint!r} in JSON schema; use {_SUPPORTED}")


def _object_schema(hint: Any, hints: dict[str, Any], required: set[str], where: str, defs: dict[str, Any],
                   seen: tuple[Any, ...]) -> dict[str, Any]:
    properties = {name: type_schema(h, f"{where}.{name}", defs, (*seen, hint)) for name, h in hints.items()}
    return {"title": hint.__name__, "type": "object", "properties": properties,
            "required": [name for name in hints if name in required], "additionalProperties": False}


def _hints(hint: Any, where: str) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(hint)
    except Exception as e:  # NameError for a forward reference it cannot resolve, and the like
        raise ValueError(f"{where}: cannot read the type hints of {hint!r}: {e}") from e
    if dataclasses.is_dataclass(hint):
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(hint)}
    return hints


def build(hint: Any, value: Any) -> Any:
    """A validated JSON value as an instance of `hint` (nested dataclasses, enums, tuples)."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return build(options[0], value) if len(options) == 1 else value
    if origin in (list, tuple) and args and isinstance(value, list):
        items = [build(args[0], v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {k: build(args[1], v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if is_pydantic_model(hint):
        return hint.model_validate(value)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = _hints(hint, hint.__name__)
        return hint(**{name: build(hints[name], v) for name, v in value.items()})
    if typing.is_typeddict(hint):
        hints = _hints(hint, hint.__name__)
        return {name: build(hints.get(name, Any), v) for name, v in value.items()}
    return value


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """The problem of `value` under `schema` (None if it validates): jsonschema when installed,
    else a check of the subset type_schema emits."""
    try:
        import jsonschema
    except ImportError:
        return _subset_problem(value, schema, "the value")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    return None if error is None else error.message


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _subset_problem(value: Any, schema: dict[str, Any], where: str) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _JSON_TYPES and not _JSON_TYPES[kind](value):
        return f"{where} should be of type {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} should be one of {schema['enum']}"
    if "anyOf" in schema and all(_subset_problem(value, s, where) for s in schema["anyOf"]):
        return f"{where} matches none of its options"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                return f"{where} lacks required {key!r}"
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                problem = _subset_problem(item, props[key], f"{where}.{key}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where} has unexpected {key!r}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _subset_problem(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None
