"""The bench's JSON-extraction workloads: W4 (16 passages, 4 fields: ../shared/bench's) and W6 (16
business documents, 8 fields that copy spans: ours, runtime/bench/copy_extraction.py). Each runs
its 16 requests one after another in each of a system's modes and reports seconds per request,
how many outputs are valid (strict: the whole output parses and matches the schema; also
leniently, from the output's first '{'), how many fields equal the truth, and for radixlm the
tokens that skipped a decode step of their own (jump-forward's forced text).

A system here has `extract(prompt, mode, task) -> str`; radixlm's modes that need engine flags of
their own (MODE_ENGINE_FLAGS) get an engine each, made when first needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from radixlm.runtime.bench import copy_extraction as w6
from radixlm.runtime.bench import workloads as wl

Result = dict[str, float]


@dataclass(frozen=True)
class ExtractionTask:
    name: str  # the workload's name in the tables: "W4", "W6"
    cases: Callable[[], list[dict[str, Any]]]  # {"prompt", "truth"} per request
    schema: dict[str, Any]
    max_tokens: int
    num_fields: int
    check: Callable[[str, Any], tuple[bool, bool, int]]  # (parses, valid, fields equal to the truth)


TASKS = {
    "W4": ExtractionTask("W4", wl.w4_cases, wl.W4_SCHEMA, wl.W4_MAX_TOKENS, 4, wl.w4_check),
    "W6": ExtractionTask("W6", w6.cases, w6.SCHEMA, w6.MAX_TOKENS, len(w6.FIELDS), w6.check),
}

# radixlm's modes per task; "unconstrained" sends no schema. "json_schema" is the engine as it ships,
# whose constrained requests draft from their prompts (speculative decoding, issue 37); "speculation
# off" is the same without drafts but the forced tokens.
OURS_MODES: dict[str, tuple[str, ...]] = {
    "W4": ("json_schema", "json_schema, jump-forward off", "json_schema, compact whitespace", "unconstrained",
           "json_schema, speculation off"),
    "W6": ("json_schema, speculation off", "json_schema"),
}
SPECULATION_OFF = "json_schema, speculation off"
# Engine flags of the modes that need an engine of their own
MODE_ENGINE_FLAGS: dict[str, dict[str, Any]] = {
    "json_schema, jump-forward off": {"disable_jump_forward": True},
    SPECULATION_OFF: {"speculative_algorithm": "NONE"},
    # the whitespace pattern is an outlines setting (xgrammar, the default backend, has its own)
    "json_schema, compact whitespace": {"constrained_json_whitespace_pattern": "", "grammar_backend": "outlines"},
}


class Extractor(Protocol):
    def extract(self, prompt: str, mode: str, task: ExtractionTask) -> str: ...

    def forget_outputs(self, mode: str) -> None:
        """Drop what drafting keeps of earlier outputs in `mode` (radixlm's n-gram cache), so that
        the warm-up request, measured again, does not draft from its own earlier output."""


def run_extraction(system: Extractor, task: ExtractionTask, mode: str,
                   counters: Callable[[str], dict[str, int]] | None = None) -> Result:
    """The task's requests one after another, after one warm-up request (for a constrained mode,
    the grammar compile; drafts from earlier outputs then forget it: `Extractor.forget_outputs`). `counters(mode)`: radixlm's running counts in that mode's engine
    (draft tokens kept, n-gram tokens kept, verify steps, tokens those steps took), reported per
    request: forced (jump-forward) tokens and n-gram tokens that skipped a decode step of their
    own, and with n-gram drafts the tokens each verify step took."""
    cases = task.cases()
    system.extract(cases[0]["prompt"], mode, task)
    system.forget_outputs(mode)
    before = counters(mode) if counters else {}
    start = time.perf_counter()
    texts = [system.extract(c["prompt"], mode, task) for c in cases]
    per_request = (time.perf_counter() - start) / len(cases)
    checks = [task.check(t, c["truth"]) for t, c in zip(texts, cases)]
    lenient = sum(task.check(wl.w4_first_object(t), c["truth"])[1] for t, c in zip(texts, cases))
    tag, n = f"{task.name} {mode}", len(cases)
    out = {f"{tag} s/request": per_request, f"{tag} valid /{n}": float(sum(c[1] for c in checks)),
           f"{tag} lenient valid /{n}": float(lenient),
           f"{tag} exact fields /{n * task.num_fields}": float(sum(c[2] for c in checks))}
    if counters and mode.startswith("json_schema"):
        delta = {k: v - before[k] for k, v in counters(mode).items()}
        out[f"{tag} jump-forward tokens /request"] = (delta["draft tokens kept"] - delta["n-gram tokens kept"]) / n
        if mode != SPECULATION_OFF:
            out[f"{tag} n-gram tokens kept /request"] = delta["n-gram tokens kept"] / n
            out[f"{tag} tokens /verify step"] = delta["verified tokens"] / max(1, delta["verify steps"])
    return out
