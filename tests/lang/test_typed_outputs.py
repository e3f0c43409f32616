"""Typed outputs: `gen(name, json_schema=T)` for a pydantic model, a dataclass or a TypedDict
constrains the gen by T's schema and makes the variable a validated T, on the tiny Engine (the
HTTP backends: tests/server/test_lang_typed_http.py). Random weights fill free text until
max_tokens, so the types here have bounded fields (Literal, enums, bounded ints)."""

from __future__ import annotations

import dataclasses
import enum
import json
import subprocess
import sys
from typing import Any, Literal, Optional, TypedDict

import jsonschema
import pydantic
import pytest

import radixlm as rl
from radixlm.backend.engine import EngineBackend
from radixlm.typed import OutputType, root_schema


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = pydantic.Field(ge=0, le=30)


class Owner(pydantic.BaseModel):
    name: Literal["Ann", "Bob"]
    pets: list[Pet] = pydantic.Field(max_length=2)


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


@dataclasses.dataclass
class Size:
    unit: Literal["cm", "in"]
    big: bool


@dataclasses.dataclass
class Parcel:
    mood: Mood
    size: Size
    fragile: bool = False


class Colour(TypedDict):
    name: Literal["red", "green", "blue"]
    bright: bool


@dataclasses.dataclass
class Node:
    children: list[Node]


@pytest.fixture(scope="module")
def backend(tiny_engine: Any) -> EngineBackend:
    return EngineBackend(tiny_engine)


@rl.function
def extract(s: Any, kind: Any, n: int = 1) -> None:
    s += "Describe it as JSON: " + rl.gen("x", json_schema=kind, max_tokens=96, n=n, temperature=0.8, seed=1)


@pytest.mark.parametrize("kind", [Owner, Parcel, Colour])
def test_the_variable_is_a_validated_instance(backend: EngineBackend, kind: Any) -> None:
    state = extract.run(kind, backend=backend)
    value, raw = state["x"], state.get_meta_info("x")["raw_text"]
    assert state.text() == "Describe it as JSON: " + raw  # the text keeps what the model wrote
    jsonschema.validate(json.loads(raw), root_schema(kind, "test"))
    if kind is Colour:
        assert value == json.loads(raw)  # a TypedDict is a dict
    else:
        assert isinstance(value, kind)
    if kind is Parcel:
        assert isinstance(value.mood, Mood) and isinstance(value.size, Size)  # nested types are built
        assert dataclasses.asdict(value) == {**json.loads(raw), "fragile": json.loads(raw).get("fragile", False),
                                             "mood": value.mood}
    if kind is Owner:
        assert value == Owner.model_validate_json(raw) and all(isinstance(p, Pet) for p in value.pets)


def test_n_samples_are_each_validated(backend: EngineBackend) -> None:
    state = extract.run(Colour, 3, backend=backend)
    values, metas = state["x"], state.get_meta_info("x")
    assert len(values) == 3 and [json.loads(m["raw_text"]) for m in metas] == values


def test_streamed_typed_gen(backend: EngineBackend) -> None:
    streamed = extract.run(Parcel, stream=True, backend=backend)
    text = "".join(streamed.text_iter("x"))
    assert isinstance(streamed["x"], Parcel) and streamed.get_meta_info("x")["raw_text"] == text


def test_output_that_does_not_validate_is_a_clear_error(backend: EngineBackend) -> None:
    @rl.function
    def cut(s: Any) -> None:  # a stop string cuts the JSON short
        s += "JSON: " + rl.gen("x", json_schema=Owner, max_tokens=64, stop=",")

    with pytest.raises(rl.OutputValidationError, match="not a valid Owner") as raised:
        cut.run(backend=backend)
    assert raised.value.raw_text.startswith("{") and not raised.value.raw_text.endswith("}")
    with pytest.raises(rl.OutputValidationError, match=r"stopped at max_tokens: raise it"):
        OutputType.of(Colour).parse('{"name": "re', {"type": "length", "length": 5})


def test_schemas_of_python_types() -> None:
    @dataclasses.dataclass
    class Item:
        name: str
        tags: list[str]
        note: Optional[str] = None  # noqa: UP045 (Optional on purpose)
        score: float | None = None
        counts: dict[str, int] = dataclasses.field(default_factory=dict)

    schema = OutputType.of(Item).schema
    assert schema["required"] == ["name", "tags"] and schema["additionalProperties"] is False
    assert schema["properties"]["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert schema["properties"]["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    item = OutputType.of(Item).parse('{"name": "a", "tags": ["x"], "note": null}')
    assert item == Item("a", ["x"])
    with pytest.raises(rl.OutputValidationError, match="not a valid Item"):
        OutputType.of(Item).parse('{"name": "a"}')
    with pytest.raises(rl.OutputValidationError, match="not JSON"):
        OutputType.of(Item).parse('{"name": ')
    # a pydantic model nested in a dataclass: its definitions move to the root
    assert "$defs" not in root_schema(Parcel, "x")
    holder = dataclasses.make_dataclass("Holder", [("owner", Owner)])
    schema = root_schema(holder, "x")
    assert set(schema["$defs"]) == {"Pet"} and schema["properties"]["owner"]["title"] == "Owner"

    with pytest.raises(ValueError, match="refers to itself"):
        OutputType.of(Node)

    @dataclasses.dataclass
    class Odd:
        items: set[int]

    with pytest.raises(ValueError, match="cannot describe type"):
        rl.gen("x", json_schema=Odd)
    with pytest.raises(TypeError, match="pydantic model, a dataclass or a TypedDict"):
        rl.gen("x", json_schema=42)


def test_the_language_and_typed_dataclasses_need_no_pydantic() -> None:
    code = (
        "import sys; sys.modules['pydantic'] = None\n"  # `import pydantic` now fails
        "import dataclasses, radixlm as rl\n"
        "@dataclasses.dataclass\nclass P:\n    x: int\n"
        "g = rl.gen('p', json_schema=P)\n"
        "print(g.output_type.parse('{\"x\": 3}'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("P(x=3)")
