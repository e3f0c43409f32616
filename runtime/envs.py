"""Environment variables read by the runtime: the one place they are read, each typed.

Every variable is prefixed `RADIXLM_`. Read a value with `RADIXLM_X.get()` at the moment it is
needed (not at import), so tests can set it with `monkeypatch.setenv`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvStr:
    """A string variable; unset or empty reads as `default`."""

    name: str
    default: str | None = None

    def get(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value else self.default


# Root of the on-disk cache of converted models (default: ~/.cache/radixlm).
RADIXLM_CACHE = EnvStr("RADIXLM_CACHE")
