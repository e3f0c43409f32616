"""The benchmarks' fixed data: JSON files in `bench/data/`, shipped in the package (pyproject's
package-data), read whole. The modules that use them (`schema_corpus`, `workloads`,
`frontend_workloads`) say what each file holds and build their cases from it; the data stays data,
reviewed and edited as JSON.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_json(name: str) -> Any:
    """The parsed contents of `data/<name>`, fresh on each call (callers may mutate them)."""
    return json.loads(resources.files("radixlm.runtime.bench").joinpath("data", name).read_text(encoding="utf-8"))
