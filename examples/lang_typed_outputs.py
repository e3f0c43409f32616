"""Typed outputs: `gen(name, json_schema=T)` with a pydantic model, a dataclass or a TypedDict as
T. The gen is constrained by T's JSON schema while it is generated, and `state[name]` is a
validated T (nested models and dataclasses built, enums as members); the text the model wrote
stays in `get_meta_info(name)["raw_text"]`. Pydantic is optional: without it the dataclass and
TypedDict parts run alone.

    python examples/lang_typed_outputs.py [--url http://127.0.0.1:30000]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    Ada Lovelace wrote the first program for Babbage's Analytical Engine in 1843.
      -> Person(name='Ada Lovelace', born=2007, field='Aerospace and A.')  (pydantic)
      -> Event(what='2007', year=2007, kind=<Kind.SCIENCE: 'science'>)  (dataclass)
      -> {'place': 'Barcelona, Spain', 'country': 'Spain'}  (TypedDict)
    ...
    Grace Hopper's team released the first COBOL compiler in 1959 in Philadelphia.
      -> Person(name='Eleanor Mauch', born=1929, field='Computer Science')  (pydantic)
      -> Event(what='1959', year=1959, kind=<Kind.SCIENCE: 'science'>)  (dataclass)
      -> {'place': 'Philadelphia', 'country': 'United States'}  (TypedDict)
    raw text of the last person: {"name": "Eleanor Mauch", "born": 1929, "field": "Computer Science"}

(always valid instances, not always right: the type constrains the form, the model picks the content)
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from typing import Any, TypedDict

import radixlm as rl

PASSAGES = [
    "Ada Lovelace wrote the first program for Babbage's Analytical Engine in 1843.",
    "Marie Curie received her second Nobel Prize, in chemistry, in 1911 in Stockholm.",
    "Grace Hopper's team released the first COBOL compiler in 1959 in Philadelphia.",
]


class Kind(enum.Enum):
    SCIENCE = "science"
    POLITICS = "politics"
    ART = "art"


@dataclasses.dataclass
class Event:
    what: str
    year: int
    kind: Kind


class Place(TypedDict):
    place: str
    country: str


def person_type() -> Any:
    """A pydantic model (bounded strings and numbers), or None without pydantic."""
    try:
        import pydantic
    except ImportError:
        return None

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        born: int = pydantic.Field(ge=1000, le=2100)
        field: str = pydantic.Field(max_length=16)

    return Person


@rl.function
def extract(s: rl.ProgramState, passage: str, person: Any) -> None:
    s += rl.system("Answer questions about the passage with compact JSON.")
    s += rl.user(f"Passage: {passage}")
    s += rl.assistant("Ready.")
    if person is not None:
        s += rl.user("Who is the person: name, year of birth, field of work?")
        s += rl.assistant(rl.gen("person", json_schema=person, max_tokens=64, temperature=0))
    s += rl.user("What happened, in which year, and what kind of event was it (science, politics or art)?")
    # dataclass fields have no bounds: a max_tokens that fits the JSON keeps the output whole
    s += rl.assistant(rl.gen("event", json_schema=Event, max_tokens=96, temperature=0))
    s += rl.user("Where did it happen: the place and its country?")
    s += rl.assistant(rl.gen("place", json_schema=Place, max_tokens=96, temperature=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    person = person_type()
    states = extract.run_batch([{"passage": p, "person": person} for p in PASSAGES])
    for passage, state in zip(PASSAGES, states):
        if state.error() is not None:  # e.g. a dataclass string longer than max_tokens allows
            print(f"{passage}\n  !! {state.error()}")
            continue
        print(passage)
        if person is not None:
            print(f"  -> {state['person']!r}  (pydantic)")
        print(f"  -> {state['event']!r}  (dataclass)")
        print(f"  -> {state['place']!r}  (TypedDict)")
    last = states[-1]
    if person is not None and last.error() is None:
        print(f"raw text of the last person: {last.get_meta_info('person')['raw_text']}")


if __name__ == "__main__":
    main()
