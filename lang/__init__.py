"""radixlm: a structured-generation language for LLM programs, and its serving runtime.

`import radixlm` gives the language and must not import torch (a client machine needs only the
HTTP dependencies). Every public name of SGLang's frontend (`sglang.__all__`) is here with
SGLang's meaning; what loads a heavy or optional dependency loads lazily: `Engine` and
`ServerArgs` (the runtime, torch), `OpenAI`, `LiteLLM`, `Crusoe` (the openai client),
`Anthropic` (the anthropic client), `VertexAI`, `Runtime`.
"""

from __future__ import annotations

import importlib
from typing import Any

from radixlm.backend.base import Backend, BackendError, NotSupportedError
from radixlm.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.global_config import global_config
from radixlm.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    separate_reasoning,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixlm.program import SglFunction, flush_cache, function, get_server_info, set_default_backend
from radixlm.state import ProgramState, ProgramStateGroup
from radixlm.tools import ToolCall, function_to_tool, tools_prompt
from radixlm.trace import ProgramTrace, TraceEntry, write_traces
from radixlm.typed import OutputValidationError

__version__ = "0.1.0"

__all__ = [
    # SGLang's public names (sglang.__all__, 0.5.23)
    "Anthropic", "Crusoe", "Engine", "LiteLLM", "OpenAI", "Runtime", "RuntimeEndpoint", "ServerArgs", "VertexAI",
    "__version__", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int",
    "gen_string", "get_server_info", "global_config", "greedy_token_selection", "image", "select",
    "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "video",
    # ours
    "Backend", "BackendError", "ChoicesDecision", "ChoicesSamplingMethod", "NotSupportedError",
    "OutputValidationError", "ProgramState", "ProgramStateGroup", "ProgramTrace", "SglFunction", "ToolCall",
    "TraceEntry", "function_to_tool", "tools_prompt", "write_traces",
]

# backends of the language: name -> (module, attribute), imported on first use
_LAZY = {
    "Runtime": ("radixlm.backend.runtime", "Runtime"),
    "OpenAI": ("radixlm.backend.openai", "OpenAI"),
    "LiteLLM": ("radixlm.backend.litellm", "LiteLLM"),
    "Crusoe": ("radixlm.backend.crusoe", "Crusoe"),
    "Anthropic": ("radixlm.backend.anthropic", "Anthropic"),
    "VertexAI": ("radixlm.backend.vertexai", "VertexAI"),
}


def __getattr__(name: str) -> Any:
    # Lazy: touching radixlm.Engine / ServerArgs is what pulls in torch, never `import radixlm`.
    if name == "Engine":
        from radixlm.runtime import Engine

        return Engine
    if name == "ServerArgs":
        from radixlm.runtime import engine  # the Engine's settings, as its module imports them

        return engine.ServerArgs
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"Engine", "ServerArgs"})
