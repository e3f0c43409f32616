"""Environment variables read by the runtime: the one place they are read, each typed.

Every variable is prefixed `RADIXLM_`. Read a value with `RADIXLM_X.get()` at the moment it is
needed (not at import), so tests can set it with `monkeypatch.setenv`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixlm.runtime.limits import GRAMMAR_COMPILE_TIMEOUT_S


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


@dataclass(frozen=True)
class EnvFloat:
    """A float variable; unset or empty reads as `default`, anything unparsable is a ValueError."""

    name: str
    default: float

    def get(self) -> float:
        value = os.environ.get(self.name)
        if not value:
            return self.default
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{self.name} must be a number of seconds, got {value!r}") from None


# Seconds a grammar's token index may take to build before the build is killed.
RADIXLM_GRAMMAR_COMPILE_TIMEOUT = EnvFloat("RADIXLM_GRAMMAR_COMPILE_TIMEOUT", GRAMMAR_COMPILE_TIMEOUT_S)
