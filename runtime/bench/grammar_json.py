"""The grammar table's rows (grammar.BackendRow) as result-file JSON and back, so that the renderer
(radixlm.runtime.bench.report) formats them with the bench's own `grammar.format_table`.

A row: {"backend": "xgrammar", "compile_secs": {"4-field": 0.124, ...}, "mask_single": PERCENTILES,
"mask_batch": PERCENTILES, "w4": W4, "coverage": COVERAGE}, each part null where it did not run,
or a failure {"kind": "refused", "reason": "..."}; PERCENTILES, W4 and COVERAGE hold the fields of
grammar.Percentiles, W4Figures and Coverage by their names (a figure a transcription lacks: null).
"""

from __future__ import annotations

from typing import Any

from radixlm.runtime.bench.grammar import BackendRow, Coverage, Failure, Percentiles, W4Figures

_PART_TYPES: dict[str, Any] = {"mask_single": Percentiles, "mask_batch": Percentiles, "w4": W4Figures,
                               "coverage": Coverage}


def _to_json(value: Any) -> Any:
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # Failure and the figures' NamedTuples
        return {k: _to_json(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def row_to_json(row: BackendRow) -> dict[str, Any]:
    return {"backend": row.name, "compile_secs": _to_json(row.compile_secs),
            **{part: _to_json(getattr(row, part)) for part in _PART_TYPES}}


def _is_failure(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == set(Failure._fields)


def _from_json(value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if _is_failure(value):
        return Failure(**value)
    if kind is Coverage:
        return Coverage(**{**value, "failures": [tuple(f) for f in value["failures"]]})
    return kind(**value)


def row_from_json(data: dict[str, Any]) -> BackendRow:
    compile_secs = data.get("compile_secs")
    if isinstance(compile_secs, dict) and not _is_failure(compile_secs):
        compile_secs = {name: Failure(**v) if _is_failure(v) else v for name, v in compile_secs.items()}
    elif compile_secs is not None:
        compile_secs = Failure(**compile_secs)
    return BackendRow(data["backend"], compile_secs,
                      **{part: _from_json(data.get(part), kind) for part, kind in _PART_TYPES.items()})
