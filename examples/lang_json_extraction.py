"""JSON extraction over a batch of passages: `gen(json_schema=...)` constrains the output to the
schema while it is generated, so every result parses and validates, whatever the model.

`run_batch(progress_bar=True)` runs the passages concurrently (the server batches them; the
shared instructions are computed once) and shows a progress bar on stderr.

    python examples/lang_json_extraction.py [--url http://127.0.0.1:30000]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    Maria Lopez is a 34-year-old nurse who has lived in Madrid all her life.
      -> {"name": "Maria Lopez", "age": 34, "job": "Nurse", "city": "Madrid"}
    At 52, Tom Becker still runs his bakery in Berlin every morning.
      -> {"name": "Tom Becker", "age": 52, "job": "Bakery Owner", "city": "Berlin"}
    The young engineer Aiko Tanaka, 27, designs bridges in Osaka.
      -> {"name": "Aiko Tanaka", "age": 27, "job": "Young Engineer", "city": "Osaka"}
    Retired teacher John Smith (71) spends his summers gardening in Dublin.
      -> {"name": "John Smith", "age": 71, "job": "Dublin", "city": "Ireland"}
    ...
    6/6 objects parse and validate

(always valid, not always right: the schema constrains the form, the model picks the content)
"""

from __future__ import annotations

import argparse
import json
import sys

import radixlm as rl
from radixlm.tools import schema_problem  # jsonschema when installed, else a built-in subset check

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "job": {"type": "string", "maxLength": 16},
        "city": {"type": "string", "maxLength": 16},
    },
    "required": ["name", "age", "job", "city"],
    "additionalProperties": False,
}
PASSAGES = [
    "Maria Lopez is a 34-year-old nurse who has lived in Madrid all her life.",
    "At 52, Tom Becker still runs his bakery in Berlin every morning.",
    "The young engineer Aiko Tanaka, 27, designs bridges in Osaka.",
    "Retired teacher John Smith (71) spends his summers gardening in Dublin.",
    "Priya Nair, a 45-year-old doctor, works at a hospital in Mumbai.",
    "Lucas Martin is a 19-year-old student at a university in Lyon.",
]


@rl.function
def extract(s: rl.ProgramState, passage: str) -> None:
    s += rl.system("Extract the person's name, age, job and city from the text as JSON.")
    s += rl.user(passage)
    s += rl.assistant(rl.gen("person", json_schema=PERSON_SCHEMA, temperature=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=160, help="enough for the longest object the schema allows")
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    states = extract.run_batch([{"passage": p} for p in PASSAGES], progress_bar=True, max_tokens=args.max_tokens)
    num_valid = 0
    for passage, state in zip(PASSAGES, states):
        print(passage)
        if state.error() is not None:
            print(f"  error: {state.error()}")
            continue
        try:
            person = json.loads(state["person"])
        except json.JSONDecodeError:  # only if max_tokens cut the object short
            print(f"  not JSON ({state.get_meta_info('person')['finish_reason']}): {state['person']!r}")
            continue
        problem = schema_problem(person, PERSON_SCHEMA)
        print(f"  -> {json.dumps(person)}" + (f"  INVALID: {problem}" if problem else ""))
        num_valid += problem is None
    print(f"{num_valid}/{len(PASSAGES)} objects parse and validate")
    sys.exit(0 if num_valid == len(PASSAGES) else 1)


if __name__ == "__main__":
    main()
