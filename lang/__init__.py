"""radixlm: a structured-generation language for LLM programs, and its serving runtime.

`import radixlm` gives the language and must not import torch (a client machine needs only the
HTTP dependencies). The in-process `Engine` lives in `radixlm.runtime` and loads lazily.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy: touching radixlm.Engine is what pulls in torch, never `import radixlm`.
    if name == "Engine":
        from radixlm.runtime import Engine

        return Engine
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
