"""The text formats the language and the runtime both speak, in one torch-free place:

- `chat_template`: the text a model's chat template puts around each role's content (derived
  once by the server, published in /get_model_info, used by the language's role blocks);
- `reasoning`: a reasoning model's `<think>...</think>` split from its answer (the server's
  `--reasoning-parser`, the language's `separate_reasoning`);
- `tool_calls`: OpenAI `tools` validated, rendered into the prompt, constrained and parsed back
  (the server's chat API, the language's `gen(tools=...)`);
  `tool_formats` reads calls in each model family's format, and `tool_stream` reads them from
  an output that arrives in deltas (name first, then argument fragments; `json_prefix` gives
  the canonical part of a JSON value a prefix decides).

Pure functions over text, no I/O, standard library only. They import nothing of radixlm outside
this package (neither the language nor the runtime; tests/test_imports.py), so either side can
use them without reaching into the other.
"""
