"""radixlm: a structured-generation language for LLM programs, and its serving runtime.

`import radixlm` gives the language and must not import torch (a client machine needs only the
HTTP dependencies). The in-process `Engine` lives in `radixlm.runtime` and loads lazily.
"""

from __future__ import annotations

from typing import Any

from radixlm.backend.base import Backend, BackendError
from radixlm.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.interpreter import ProgramState, ProgramStateGroup
from radixlm.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixlm.program import SglFunction, flush_cache, function, get_server_info, set_default_backend
from radixlm.tools import ToolCall, function_to_tool, tools_prompt

__version__ = "0.1.0"

__all__ = [
    "Backend", "BackendError", "Engine", "OpenAI", "ProgramState", "ProgramStateGroup", "Runtime", "RuntimeEndpoint",
    "SglFunction", "ToolCall", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function",
    "function_to_tool", "gen", "gen_int", "gen_string", "get_server_info", "select", "set_default_backend",
    "system", "system_begin", "system_end", "tools_prompt", "user", "user_begin", "user_end",
]


def __getattr__(name: str) -> Any:
    # Lazy: touching radixlm.Engine is what pulls in torch, never `import radixlm`.
    if name == "Engine":
        from radixlm.runtime import Engine

        return Engine
    if name == "Runtime":
        from radixlm.backend.runtime import Runtime

        return Runtime
    if name == "OpenAI":
        from radixlm.backend.openai import OpenAI

        return OpenAI
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
