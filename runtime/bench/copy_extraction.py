"""W6: JSON extraction whose fields copy spans of the passage.

16 business passages (invoices, tickets, shipping notices, claims...), each naming a person, an
e-mail address, a company, a reference number, a date, an amount, a city and a sentence the person
said; the request asks for those eight fields as one JSON object under W6_SCHEMA, greedy. Every
field's value is a span of the passage, the quote a long one: the workload where drafting tokens
from the prompt (speculative decoding's n-gram drafts, issue 37) has the most to copy.

Deterministic: templates and word lists are data (data/w6_extraction.json, ours: W6 is not one of
../shared/bench's workloads), the values come from a fixed seed.
tests/runtime/test_bench_workloads.py pins the prompts' digest and checks that every truth value
is a span of its passage.
"""

from __future__ import annotations

import json
import random
from typing import Any

from radixlm.runtime.bench.data_files import load_json
from radixlm.runtime.bench.workloads import SEED, chatml

_DATA = load_json("w6_extraction.json")
_NAMES = load_json("workloads.json")

NUM_CASES = 16
MAX_TOKENS = 192  # the longest truth as JSON is ~110 tokens of the default model
FIELDS = ("name", "email", "company", "reference", "date", "amount", "city", "quote")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {field: {"type": "string"} for field in FIELDS},
    "required": list(FIELDS),
    "additionalProperties": False,
}
INSTRUCTION = ("Extract from the document below the person's name, their email address, their company, the "
               "reference number, the date, the amount, the city and the sentence the person is quoted "
               "saying. Copy each value exactly as it is written in the document. Reply with a JSON object "
               "with the keys " + ", ".join(FIELDS) + ".")


def cases() -> list[dict[str, Any]]:
    """The 16 requests: {"prompt": the ChatML prompt, "truth": field -> value}."""
    rng = random.Random(SEED + 6)
    templates, quotes = _DATA["templates"], _DATA["quotes"]
    out = []
    for i in range(NUM_CASES):
        first, last = rng.choice(_NAMES["first_names"]), rng.choice(_NAMES["last_names"])
        company = rng.choice(_DATA["companies"])
        domain = company.lower().replace("&", "and").replace(" ", "")
        truth = {
            "name": f"{first} {last}",
            "email": f"{first[0].lower()}.{last.lower()}@{domain}.com",
            "company": company,
            "reference": f"{_DATA['reference_prefixes'][i % len(templates)]}-{rng.randint(2023, 2026)}-"
                         f"{rng.randint(100, 99999):05d}",
            "date": f"{rng.choice(_DATA['months'])} {rng.randint(1, 28)}, {rng.randint(2023, 2026)}",
            "amount": f"{rng.choice(_DATA['currencies'])}{rng.randint(40, 48000):,}.{rng.randint(0, 99):02d}",
            "city": rng.choice(_NAMES["cities"]),
            "quote": quotes[i % len(quotes)],
        }
        passage = templates[i % len(templates)].format(**truth)
        out.append({"prompt": chatml(f"{INSTRUCTION}\n\nDocument:\n{passage}"), "truth": truth})
    return out


def check(text: str, truth: dict[str, str]) -> tuple[bool, bool, int]:
    """(parses, validates against SCHEMA, fields equal to the truth) of one output."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False, False, 0
    valid = (isinstance(obj, dict) and set(obj) == set(FIELDS)
             and all(isinstance(obj[field], str) for field in FIELDS))
    exact = sum(1 for field in FIELDS if isinstance(obj, dict) and obj.get(field) == truth[field])
    return True, valid, exact
