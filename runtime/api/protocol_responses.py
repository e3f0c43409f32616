"""The contract of OpenAI's Responses API (`POST /v1/responses`) for what a text model can do:
typed request models (strict types, unknown fields refused, as `protocol`'s), one model per
input item type (`INPUT_ITEM_MODELS`, dispatched on `type`), and the response documented for
/openapi.json. Input items and tools are validated one by one by the route (`responses_api`),
so that an error names the item (`input[2].call_id`, `tools[0].type`).

Accepted and without effect here: `include`, `reasoning`, `service_tier`, `prompt_cache_key`,
`safety_identifier`, `stream_options`, `text.verbosity`, `truncation: "disabled"` (a prompt
longer than the context is refused, never cut), and items' `id` / `status` fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SkipValidation

from radixlm.runtime.api.json_types import Int, Strict, either
from radixlm.runtime.api.protocol import Out, _ranged

MAX_METADATA_PAIRS = 16  # OpenAI's limits of `metadata`
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


# ---------------------------------------------------------------- requests: input items
class InputText(Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: Any = None


class OutputText(Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(Strict):
    type: Literal["refusal"]
    refusal: str


TextPart = Annotated[InputText | OutputText | Refusal, Field(discriminator="type")]
Content = either(str | list[TextPart], "a string or a list of text parts (input_text, output_text or refusal)")


class MessageItem(Strict):
    """A message; `type` may be left out (OpenAI's "easy" input message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(Strict):
    """A call the model made (a previous output item, sent back)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str = Field(description="a JSON object, serialized")
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Strict):
    """The result of running a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: either(str | list[TextPart], "a string or a list of text parts")
    id: str | None = None
    status: str | None = None


class ReasoningItem(Strict):
    """A reasoning model's previous reasoning, sent back: not put in the prompt (as chat
    templates drop a past turn's reasoning)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


INPUT_ITEM_MODELS: dict[str, type[Strict]] = {
    "message": MessageItem, "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem,
}
InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


# ---------------------------------------------------------------- requests: tools, formats
class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema of the arguments")
    strict: bool | None = None


class NamedFunctionChoice(Strict):
    type: Literal["function"]
    name: str


class TextFormatText(Strict):
    type: Literal["text"]


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(Strict):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: bool | None = None


class ResponsesRequest(Strict):
    """POST /v1/responses. `input` items and `tools` are checked item by item (the models
    above); `tool_choice` by the tool-call code, so their types here document."""

    model: str | None = None
    input: either(str | list[dict[str, Any]], "a string or a list of input items")
    instructions: str | None = None
    tools: Annotated[list[FunctionTool] | None, SkipValidation] = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedFunctionChoice | None, SkipValidation] = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: Int | None = Field(default=None, ge=1)
    temperature: float | None = _ranged("temperature")
    top_p: float | None = _ranged("top_p")
    metadata: dict[str, str] | None = Field(default=None, description=f"at most {MAX_METADATA_PAIRS} pairs")
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    store: bool = Field(default=True, description="keep the response for GET and previous_response_id")
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["disabled"] | None = Field(default=None, description="'auto' (cutting the input) is not supported")
    service_tier: str | None = None


# ---------------------------------------------------------------- responses (documented)
class InputTokensDetails(Out):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(Out):
    reasoning_tokens: int


class ResponseUsage(Out):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(Out):
    """A response (POST's answer, GET's, and the `response` of stream events)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]] = Field(description="message, function_call and reasoning items")
    instructions: str | None
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool
    text: dict[str, Any]
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    metadata: dict[str, str]
    user: str | None
    store: bool
    previous_response_id: str | None
    usage: ResponseUsage | None
    error: dict[str, Any] | None
    incomplete_details: dict[str, Any] | None


class DeletedResponse(Out):
    id: str
    object: Literal["response"]
    deleted: bool


class ResponseEvent(Out):
    """One server-sent event of a streamed response: `type` names it (response.created, ...,
    response.completed), `sequence_number` counts from 0."""

    type: str
    sequence_number: int
    response: ResponseObject | None = None
    item: dict[str, Any] | None = None
    output_index: int | None = None
    content_index: int | None = None
    item_id: str | None = None
    part: dict[str, Any] | None = None
    delta: str | None = None
    text: str | None = None
    arguments: str | None = None
    name: str | None = Field(default=None, description="response.function_call_arguments.done: the function")
    logprobs: list[Any] | None = None
    code: str | None = Field(default=None, description="error: what kind of error")
    message: str | None = Field(default=None, description="error: what went wrong")
    param: str | None = None
