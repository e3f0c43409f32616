"""The HTTP contract: typed pydantic models of every request and response body, native (SGLang's
/generate) and OpenAI, from which `/openapi.json` is built (`OpenAPIDocs`).

Requests are validated by these models and nowhere else for shape and types: strict JSON types
(no `"5"` for an integer, no `1` for a boolean), unknown fields refused, integral floats (`5.0`)
taken as integers. What a type cannot say is checked after them, each rule once: ranges of
sampling parameters and the grammar rules by `SamplingParams` (the ranges are published here from
its own table), rules that need the model (context length, vocabulary) by
`request_io.RequestValidator`, tools and `tool_choice` by `tool_calls.parse_tools` /
`parse_tool_choice` (shared with the language; their fields are typed here as documentation,
`SkipValidation`). A `ValidationError` becomes a `RequestError` (HTTP 400) through
`validation_message`, which names the field (`sampling_params.top_k`, `messages[0].content`).

The rest of SGLang's request schema (fields accepted at their defaults, or without effect here,
and the few more we implement) comes from the mixins of `protocol_sglang`.

Responses are documented by the response models; the server builds them as plain dicts (the
suite's schemathesis run checks every response against its model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SkipValidation,
    Tag,
    TypeAdapter,
    ValidationError,
    WrapValidator,
)

from radixlm.formats.reasoning import REASONING_PARSERS
from radixlm.runtime.api.errors import RequestError
from radixlm.runtime.api.json_types import Int, IntRange, Strict, TokenId, either
from radixlm.runtime.api.protocol_sglang import (
    SglangChatFields,
    SglangCompletionFields,
    SglangGenerateFields,
    SglangSamplingFields,
)
from radixlm.runtime.config.limits import (
    MAX_N,
    MAX_OPENAI_TOP_LOGPROBS,
    MAX_RID_CHARS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS_NUM,
    MAX_TRACE_CALLS_PER_POST,
)
from radixlm.runtime.sampling.sampling_params import FLOAT_RANGES

T = TypeVar("T")


def _float_range(name: str) -> dict[str, Any]:
    """The JSON-schema bounds of a float sampling parameter, from SamplingParams' own table."""
    low, low_inclusive, high, high_inclusive, text = FLOAT_RANGES[name]
    bounds: dict[str, Any] = {"minimum" if low_inclusive else "exclusiveMinimum": low}
    if high is not None:
        bounds["maximum" if high_inclusive else "exclusiveMaximum"] = high
    return {"description": text, "json_schema_extra": bounds}


def _ranged(name: str) -> Any:
    return Field(default=None, **_float_range(name))


def bounds(description: str | None = None, **schema: Any) -> Any:
    """An optional field whose bounds `schema` are published here but checked after the types
    (by SamplingParams or the request's own checks, with their messages)."""
    return Field(default=None, description=description, json_schema_extra=schema)


class Out(BaseModel):
    """A response body: exactly these fields."""

    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- native API: requests
NonEmpty = Annotated[T, Field(min_length=1)]  # a list with at least one item
StopStrings = either(str | list[str] | None, "a string or a list of strings")
STOP_BOUNDS = {"maxItems": MAX_STOP_STRINGS, "items": {"minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}}


class SamplingParamsInput(Strict, SglangSamplingFields):
    """`sampling_params` of /generate (SGLang's names). A null value means the default."""

    max_new_tokens: Int | None = bounds("null: until the context length", minimum=0)
    min_new_tokens: Int | None = bounds(minimum=0)
    temperature: float | None = _ranged("temperature")
    top_p: float | None = _ranged("top_p")
    top_k: Int | None = Field(default=None, description="-1 (disabled) or >= 1")
    min_p: float | None = _ranged("min_p")
    frequency_penalty: float | None = _ranged("frequency_penalty")
    presence_penalty: float | None = _ranged("presence_penalty")
    repetition_penalty: float | None = _ranged("repetition_penalty")
    stop: StopStrings = bounds(**STOP_BOUNDS)
    stop_token_ids: list[TokenId] | None = bounds(maxItems=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    n: Int | None = bounds("copies of the prompt", minimum=1, maximum=MAX_N)
    seed: Int | None = None
    sampling_seed: Int | None = Field(default=None, description="SGLang's name of `seed`")
    regex: str | None = None
    json_schema: str | None = Field(default=None, description="a JSON schema, as JSON text")
    ebnf: str | None = Field(default=None, description="a grammar (--grammar-backend xgrammar or llguidance)")
    structural_tag: str | None = Field(default=None, description="triggered structures, as JSON text")
    no_stop_trim: bool | None = None
    stop_regex: either(str | list[str] | None, "a string or a list of strings") = Field(
        default=None, description="regular expressions (Python syntax; no anchors, lookaround or backreferences): "
        "generation stops where the text first matches one, cut there as at a stop string")


class GenerateReqInput(Strict, SglangGenerateFields):
    """POST /generate: one prompt (`text` or `input_ids`) or a batch (a list of them); exactly
    one of the two. `sampling_params`, `rid` and the three logprob options are one for all, or a
    list with one per prompt (as SGLang)."""

    # exactly one of text / input_ids, null counting as absent (in the document: `oneOf` below)
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in ("text", "input_ids")]})

    text: either(str | NonEmpty[list[str]] | None, "a string or a non-empty list of strings") = None
    input_ids: either(NonEmpty[list[TokenId]] | NonEmpty[list[NonEmpty[list[TokenId]]]] | None,
                      "a non-empty list of token ids or a non-empty list of such lists") = None
    sampling_params: SamplingParamsInput | list[SamplingParamsInput | None] | None = None
    rid: either(str | list[str | None] | None, "a string or a list with one per prompt") = bounds(
        f"a request id of at most {MAX_RID_CHARS} characters", maxLength=MAX_RID_CHARS)
    return_logprob: either(bool | list[bool] | None, "true, false or a list with one per prompt") = None
    logprob_start_len: either(Int | list[Int] | None, "an integer or a list with one per prompt") = bounds(
        "-1: no prompt log-probabilities (or a list with one per prompt)", minimum=-1)
    top_logprobs_num: either(Int | list[Int] | None, "an integer or a list with one per prompt") = bounds(
        "(or a list with one per prompt)", minimum=0, maximum=MAX_TOP_LOGPROBS_NUM)
    return_text_in_logprobs: bool | None = None
    stream: bool | None = None
    require_reasoning: bool | None = Field(default=None, description="the output starts with reasoning: with "
                                           "--reasoning-parser, a grammar applies only after the reasoning ends")


class AbortReqInput(Strict):
    """POST /abort_request."""

    rid: str


class SeparateReasoningReqInput(Strict):
    """POST /separate_reasoning (SGLang's): a text split by the named reasoning parser."""

    text: str
    reasoning_parser: str = Field(description="the format's name (an unknown one is a 400)",
                                  json_schema_extra={"enum": list(REASONING_PARSERS)})


# ---------------------------------------------------------------- native API: responses
LogprobEntry = tuple[float | None, int, str | None]  # [logprob, token id, token text or null]


class FinishReasonOut(Out):
    type: Literal["stop", "length", "abort"]
    matched: int | str | None = Field(description="the EOS / stop token id or stop string that matched")
    message: str | None = None
    closed_by_budget: bool | None = Field(default=None, description="a grammar's budget steered the last tokens")


class MetaInfo(Out):
    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: FinishReasonOut | None
    e2e_latency: float
    input_token_logprobs: list[LogprobEntry | None] | None = None
    output_token_logprobs: list[LogprobEntry] | None = None
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    output_top_logprobs: list[list[LogprobEntry]] | None = None
    output_token_logprobs_length: int | None = Field(default=None, description="streaming: entries so far")
    # with --speculative-algorithm (SGLang's names)
    spec_verify_ct: int | None = Field(default=None, description="speculative decoding: steps that verified "
                                       "this request's drafts")
    spec_accept_length: float | None = Field(default=None, description="completion_tokens / spec_verify_ct")
    spec_num_proposed_drafts: int | None = Field(default=None, description="n-gram draft tokens proposed")
    spec_num_correct_drafts: int | None = Field(default=None, description="n-gram draft tokens accepted")


class GenerateOutput(Out):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo
    index: int | None = Field(default=None, description="streamed batches: the sequence this chunk is of")


class ModelInfo(Out):
    model_path: str
    tokenizer_path: str
    is_generation: bool
    chat_template: dict[str, Any] | None = Field(description="the text around each role's content")


class LoadInfo(Out):
    """One data-parallel rank's load (GET /get_load, as sglang-router reads it)."""

    dp_rank: int
    num_reqs: int = Field(description="running and waiting")
    num_waiting_reqs: int
    num_tokens: int = Field(description="KV tokens held by requests")


def renamed_to(name: str) -> Any:
    """A field's old name (issue 36: one name per concept), still sent beside `name` until the next release."""
    return Field(description=f"deprecated alias of {name}, removed in the next release",
                 deprecated=f"renamed to {name}")


class KvPoolInfo(Out):
    free_tokens: int
    total_tokens: int = renamed_to("max_total_num_tokens (top level)")


class RadixCacheInfo(Out):
    tree_tokens: int = Field(description="held by the radix tree")
    evictable_tokens: int
    hit_rate: float
    num_queried_tokens: int = Field(description="prompt tokens looked up (hit_rate's denominator)")
    num_matched_tokens: int = Field(description="of those, found cached (hit_rate's numerator)")
    num_evicted_tokens: int = Field(description="evicted to make room, since the start")
    cached_tokens: int = renamed_to("tree_tokens")
    evicted_tokens: int = renamed_to("num_evicted_tokens")


class ServerInfo(BaseModel):
    """The server's settings (every `radixlm serve` flag by its field name, e.g. `grammar_backend`;
    null where the flag was left to its default) and the scheduler's state."""

    model_config = ConfigDict(extra="allow")
    model_path: str | None
    context_length: int | None
    max_total_tokens: int | None = Field(description="the flag as given (null: sized from mem_fraction_static)")
    max_total_num_tokens: int = Field(description="the KV pool's size in tokens (SGLang's name): what "
                                      "--max-total-tokens resolved to")
    grammar_backend: str
    has_api_key: bool
    kv_pool: KvPoolInfo
    radix_cache: RadixCacheInfo
    num_running_reqs: int
    num_waiting_reqs: int
    num_grammar_queue_reqs: int
    num_retractions: int
    scheduler_pid: int
    resolved_dtype: str = Field(description="the dtype the weights run in (what `--dtype auto` resolved to)")
    resolved_kv_dtype: str = Field(description="the KV pool's dtype")
    quantized_activations_mode: str | None = Field(
        description="how quantized layers multiply (float32, int8, int8_row); null without quantized layers")
    cpu_isa: str | None = Field(description="the ISA level the C++ CPU kernels run at (generic, avx2, avx2_vnni, avx512; "
                                "generic, neon, neon_dotprod, neon_i8mm); null where torch ops do all the work")
    cpu_isa_features: list[str] = Field(description="the CPU features those kernels use at that level")
    dp_size: int = Field(description="data-parallel ranks (--dp-size); the counts above are their sums")
    tp_size: int = Field(1, description="tensor-parallel ranks (--tp-size)")
    tp_worker_pids: list[int] = Field([], description="with --tp-size > 1, the processes of ranks 1..N-1 (rank 0 is "
                                      "the scheduler)")
    internal_states: list[dict[str, Any]] | None = Field(
        None, description="with --dp-size > 1, each rank's own state (its dp_rank, scheduler_pid, kv_pool, "
        "radix_cache, request counts, and num_dispatched_reqs: requests the front sent it)")


class CacheTreeNode(Out):
    id: int = Field(description="the node's id (its creation order in the cache)")
    parent: int | None = Field(description="the parent's id; null for a child of the root")
    label: str = Field(description="the text of the node's first tokens")
    num_tokens: int
    lock_ref: int = Field(description="running requests reading this node")
    is_locked: bool = Field(description="locked (lock_ref > 0) or evictable")
    last_access: int = Field(description="the cache's logical clock at the node's last use (see tree.clock)")
    num_children: int
    num_hidden_children: int = Field(description="children not in the answer")


class CacheTreeView(Out):
    nodes: list[CacheTreeNode] = Field(description="the nodes holding the most tokens, parents first")
    num_nodes: int = Field(description="nodes in the whole cache")
    tree_tokens: int = Field(description="held by the whole tree (evictable + locked)")
    evictable_tokens: int
    locked_tokens: int
    clock: int = Field(description="the cache's logical clock now (a counter of cache operations)")
    num_visited: int = Field(description="nodes read to build this answer (bounded by max_nodes)")
    total_tokens: int = renamed_to("tree_tokens")


class PoolState(Out):
    max_total_num_tokens: int = Field(description="the KV pool's size in tokens")
    free_tokens: int
    tree_tokens: int = Field(description="held by the radix tree")
    used_tokens: int = Field(description="held by running requests (not yet cached)")
    total_tokens: int = renamed_to("max_total_num_tokens")
    cached_tokens: int = renamed_to("tree_tokens")


class CacheCounters(Out):
    num_queried_tokens: int = Field(description="prompt tokens looked up in the cache, since the start")
    num_matched_tokens: int = Field(description="... of which found cached")
    hit_rate: float
    num_evicted_tokens: int = Field(description="evicted to make room, since the start")
    queried_tokens: int = renamed_to("num_queried_tokens")
    matched_tokens: int = renamed_to("num_matched_tokens")
    evicted_tokens: int = renamed_to("num_evicted_tokens")


class StepRate(Out):
    num_forwards: int
    window_s: float
    extend_tokens_per_s: float = Field(description="prompt tokens computed per second over the window")
    decode_tokens_per_s: float = Field(description="tokens decoded per second over the window")
    steps_per_s: float


class GrammarInfo(Out):
    kind: Literal["json_schema", "regex", "ebnf", "structural_tag"]
    spec: str = Field(description="the grammar's first characters")


class DashboardReq(Out):
    rid: str
    state: Literal["running", "prefilling", "waiting", "grammar"]
    prompt_head: str = Field(description="the text of the prompt's first tokens")
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = Field(description="generated so far")
    generated_tokens: int = renamed_to("completion_tokens")
    grammar: GrammarInfo | None
    matched_node: int | None = Field(
        description="the deepest node of its cached prefix that is in tree.nodes (null while waiting)")


class ServerCounters(Out):
    requests_started: int
    requests_finished: int
    requests_aborted: int
    prompt_tokens: int
    generation_tokens: int = Field(description="of finished and aborted requests")
    ttft_sum: float = Field(description="seconds, over ttft_count first tokens")
    ttft_count: int
    itl_sum: float = Field(description="seconds, over itl_count gaps between output tokens")
    itl_count: int


class CacheTree(Out):
    """GET /cache_tree: the radix cache, the KV pool and the requests, bounded in size."""

    tree: CacheTreeView
    pool: PoolState
    cache: CacheCounters
    steps: StepRate
    server: ServerCounters
    num_running_reqs: int
    num_waiting_reqs: int
    running: list[DashboardReq] = Field(description="at most 64")
    waiting: list[DashboardReq] = Field(description="at most 64 (state grammar: its grammar is compiling)")


class TraceCall(Strict):
    """One model call of a program run, as the language's trace records it (`radixlm.trace`;
    `ProgramTrace.to_calls()`): its counts and times, not its text."""

    program: str = Field(max_length=256)
    run_id: str = Field(max_length=64)
    branch: str = Field(max_length=64, description='the fork path ("" for the program itself, "0", "0.1" ...)')
    index: Int = Field(ge=0, description="order of completion within the run")
    primitive: Literal["gen", "select", "tool_call"]
    name: str | None = Field(default=None, max_length=256)
    prompt_tokens: IntRange(ge=0) | None = None
    cached_tokens: IntRange(ge=0) | None = None
    completion_tokens: IntRange(ge=0) | None = None
    latency_s: float = Field(ge=0)
    started_at: float = Field(description="Unix time")
    error: str | None = Field(default=None, max_length=1024)


class TracesInput(Strict):
    entries: list[TraceCall] = Field(max_length=MAX_TRACE_CALLS_PER_POST)


class TracesAccepted(Out):
    accepted: int
    kept: int = Field(description="entries the server holds now (the newest, at most 2000)")


class TracesOutput(Out):
    entries: list[TraceCall] = Field(description="the newest entries, oldest first")


class SeparateReasoningOutput(Out):
    text: str = Field(description="the answer: the text after the reasoning")
    reasoning_text: str = Field(description="the reasoning, without its markers (empty if there is none)")


class ErrorDetail(Out):
    message: str
    code: int


class ErrorResponse(Out):
    error: ErrorDetail


# ---------------------------------------------------------------- OpenAI API: requests
class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = Field(
        default=False, description="usage so far (prompt, completion, total) in every chunk (vLLM's, SGLang's)")


class FunctionSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema of the arguments")
    strict: bool | None = None


class ToolSpec(Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class RegexFormat(Strict):
    type: Literal["regex"]
    regex: str


class StructureSpec(Strict):
    begin: str
    schema_: dict[str, Any] = Field(alias="schema")
    end: str


class StructuralTagFormat(Strict):
    type: Literal["structural_tag"]
    structures: list[StructureSpec]
    triggers: list[str]


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat | RegexFormat | StructuralTagFormat


def _as_sent(value: Any, handler: Callable[[Any], Any]) -> Any:
    """Validate by the type (unknown fields refused, as the document says), keep the JSON as sent:
    the grammar code (`response_format_grammar`) reads the dict."""
    handler(value)
    return value


def _format_type(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    return _FORMAT_TAGS.get(kind) if isinstance(kind, str) else None


# tags as union-member names (capitalized): validation_message leaves them out of a field's path
_FORMAT_TAGS = {"text": "TextFormat", "json_object": "JsonObjectFormat", "json_schema": "JsonSchemaFormat",
                "regex": "RegexFormat", "structural_tag": "StructuralTagFormat"}
TaggedResponseFormat = Annotated[
    Annotated[TextFormat, Tag("TextFormat")] | Annotated[JsonObjectFormat, Tag("JsonObjectFormat")]
    | Annotated[JsonSchemaFormat, Tag("JsonSchemaFormat")] | Annotated[RegexFormat, Tag("RegexFormat")]
    | Annotated[StructuralTagFormat, Tag("StructuralTagFormat")],
    Discriminator(_format_type, custom_error_type="response_format_type",
                  custom_error_message="must be an object whose type is " + ", ".join(_FORMAT_TAGS))]
CheckedResponseFormat = Annotated[TaggedResponseFormat | None, WrapValidator(_as_sent)]


class SamplingFields(Strict):
    model: str | None = None
    max_tokens: IntRange(ge=0) | None = None
    temperature: float | None = _ranged("temperature")
    top_p: float | None = _ranged("top_p")
    n: Int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopStrings = bounds(**STOP_BOUNDS)
    seed: Int | None = None
    presence_penalty: float | None = _ranged("presence_penalty")
    frequency_penalty: float | None = _ranged("frequency_penalty")
    user: str | None = None
    # SGLang extensions
    top_k: Int | None = None
    min_p: float | None = _ranged("min_p")
    repetition_penalty: float | None = _ranged("repetition_penalty")
    min_tokens: IntRange(ge=0) | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = bounds(maxItems=MAX_STOP_TOKEN_IDS)
    skip_special_tokens: bool | None = None
    rid: str | None = None
    regex: str | None = Field(default=None, description="SGLang extension: constrain the output to a regex")
    json_schema: either(str | dict[str, Any] | None, "a JSON schema (object or JSON text)") = None
    ebnf: str | None = Field(default=None, description="SGLang extension: a grammar (xgrammar or llguidance)")
    structural_tag: either(str | dict[str, Any] | None, "a structural tag (object or JSON text)") = None


class CompletionRequest(SamplingFields, SglangCompletionFields):
    """POST /v1/completions."""

    prompt: either(str | NonEmpty[list[str]] | NonEmpty[list[TokenId]] | NonEmpty[list[NonEmpty[list[TokenId]]]],
                   "a string, or a non-empty list of strings, of token ids or of such lists")
    max_tokens: IntRange(ge=0) | None = 16
    logprobs: IntRange(ge=0, le=MAX_OPENAI_TOP_LOGPROBS) | None = None
    echo: bool = False
    response_format: CheckedResponseFormat = Field(default=None, description="SGLang's: as in chat completions")


class ContentPart(Strict):
    type: Literal["text"]
    text: str


class ToolCallFunction(Strict):
    name: str
    arguments: str = Field(description="a JSON object, serialized")


class CalledFunction(Strict):
    name: str
    arguments: str | dict[str, Any] = Field(description="a JSON object, serialized or as is")


class ToolCallInput(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: either(str | list[ContentPart] | None, "a string or a list of text content parts") = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCallInput] | None, SkipValidation] = Field(
        default=None, description="assistant messages: the calls it made (checked when rendered)")
    tool_call_id: str | None = Field(default=None, description="tool messages")


class ChatRequest(SamplingFields, SglangChatFields):
    """POST /v1/chat/completions. `tools`, `tool_choice` and `response_format` are checked by
    the tool-call and grammar code (messages naming the field), so their types here document."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: IntRange(ge=0) | None = None
    logprobs: bool = False
    top_logprobs: IntRange(ge=0, le=MAX_OPENAI_TOP_LOGPROBS) | None = None
    response_format: CheckedResponseFormat = None
    tools: Annotated[list[ToolSpec] | None, SkipValidation] = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedToolChoice | None, SkipValidation] = None
    # SGLang's reasoning fields (they matter with --reasoning-parser)
    separate_reasoning: bool = Field(default=True, description="the reasoning in reasoning_content, apart from content")
    stream_reasoning: bool = Field(default=True, description="stream: reasoning as it comes; false: at once when it ends")


# ---------------------------------------------------------------- OpenAI API: responses
class CachedTokens(Out):
    cached_tokens: int


class Usage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CachedTokens


class CompletionLogprobs(Out):
    tokens: list[str | None]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float | None] | None] | None
    text_offset: list[int]


FinishReasonName = Literal["stop", "length", "abort", "tool_calls"] | None


class CompletionChoice(Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReasonName


class CompletionResponse(Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    grammar_backend: str | None = Field(
        default=None, description="the engine that enforced the request's grammar (radixlm's; absent without one)")
    schema_stricter: list[str] | None = Field(
        default=None, description="the JSON schema's keywords served by a stricter form, which may leave out valid "
                                  "outputs (radixlm's; absent when none)")


class TopLogprob(Out):
    token: str
    logprob: float | None
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Out):
    content: list[TokenLogprob]


class ToolCallOutput(Out):
    index: int | None = Field(default=None, description="streamed calls only")
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class AssistantMessage(Out):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = Field(default=None, description="with --reasoning-parser and separate_reasoning")
    tool_calls: list[ToolCallOutput] | None = None


class ChatChoice(Out):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonName


class ChatCompletionResponse(Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    grammar_backend: str | None = Field(
        default=None, description="the engine that enforced the request's grammar (radixlm's; absent without one)")
    schema_stricter: list[str] | None = Field(
        default=None, description="the JSON schema's keywords served by a stricter form, which may leave out valid "
                                  "outputs (radixlm's; absent when none)")


class CompletionChunk(Out):
    """One event of a streamed /v1/completions (the last may carry only `usage`)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatDelta(Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOutput] | None = None


class ChatChunkChoice(Out):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonName


class ChatCompletionChunk(Out):
    """One event of a streamed /v1/chat/completions (the last may carry only `usage`)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Out):
    object: Literal["list"]
    data: list[ModelCard]


# ---------------------------------------------------------------- validation
def parse_body(model: type[Strict], body: Any, prefix: str = "") -> Any:
    """`body` validated by `model`; a RequestError naming the first bad field otherwise."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise RequestError(validation_message(e, prefix)) from None


def validation_message(error: ValidationError, prefix: str = "") -> str:
    """One line saying what is wrong and where. Unknown fields are listed together; of a union's
    per-member errors, the deepest (the member the value came closest to) is told."""
    errors = [{**e, "loc": _field_path(e)} for e in error.errors(include_url=False)]
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        parent = extra[0]["loc"][:-1]
        names = sorted({str(e["loc"][-1]) for e in extra if e["loc"][:-1] == parent})
        if parent == ("sampling_params",) and not prefix:
            return "unknown sampling parameter" + ("s " if len(names) > 1 else " ") + ", ".join(map(repr, names))
        return f"unknown field(s) in {_path(parent, prefix) or 'the request body'}: {names}"
    first = max(errors, key=lambda e: len(e["loc"]))  # max keeps the first of equals
    where = _path(first["loc"], prefix) or "the request body"
    kind, value = first["type"], first.get("input")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where} must be a JSON object, got {_shown(value)}"
    if kind == "missing":
        return f"{where} is required"
    text = _MESSAGES.get(kind, first["msg"][0].lower() + first["msg"][1:])
    return f"{where} {text.format(**first.get('ctx', {}))}, got {_shown(value)}"


def _field_path(error: Any) -> tuple[int | str, ...]:
    """An error's location without union tags (an unknown key, last, is kept whatever it is)."""
    loc = tuple(error["loc"])
    keep = loc[-1:] if error["type"] == "extra_forbidden" else ()
    return tuple(p for p in loc[: len(loc) - len(keep)] if not _is_union_tag(p)) + keep


def _is_union_tag(part: int | str) -> bool:
    """pydantic names a union member in an error's location (`str`, `list[int]`, a model's
    name); our field names are lower-case identifiers."""
    return isinstance(part, str) and (not part.isidentifier() or not part.islower() or part in _TYPE_TAGS)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


_MESSAGES = {
    "int_type": "must be an integer", "int_from_float": "must be an integer", "int_parsing": "must be an integer",
    "float_type": "must be a number", "bool_type": "must be true or false", "string_type": "must be a string",
    "list_type": "must be a list", "literal_error": "must be {expected}",
    "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}",
    "too_long": "must hold at most {max_length} items", "too_short": "must hold at least {min_length} items",
    "string_too_long": "must be at most {max_length} characters", "string_too_short": "must not be empty",
    "string_pattern_mismatch": "must match {pattern}", "either": "must be {expected}",
    "response_format_type": "must be an object whose type is " + ", ".join(_FORMAT_TAGS),
}


def _path(loc: Sequence[int | str], prefix: str) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------- /openapi.json
JSON, SSE, TEXT = "application/json", "text/event-stream", "text/plain"
REF = "#/components/schemas/{model}"


@dataclass
class Operation:
    """The documented request body (a type) and responses of one route: status -> (description,
    {media type: a type, or a JSON schema dict, or None for no body})."""

    request: Any = None
    responses: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)


ERRORS: dict[int, str] = {
    400: "the request is invalid: the message names the field",
    401: "missing or wrong API key (when the server has one)",
    404: "the model named is not served here",
    413: "the body is larger than the limit",
    503: "the server is shutting down or a child process died",
}


def error_responses(*codes: int) -> dict[int, tuple[str, dict[str, Any]]]:
    return {code: (ERRORS[code], {JSON: ErrorResponse}) for code in codes}


@dataclass(frozen=True)
class SseEvents:
    """An SSE body: each event's `data` is `[DONE]` (the last event), a JSON `chunk`, or a JSON
    error (a request of a batch that failed after the stream began). In OpenAPI 3.1 a
    text/event-stream `schema` describes one event."""

    chunk: type[BaseModel]


class OpenAPIDocs:
    """Builds the operations' request and response documentation from the models above and puts
    it into FastAPI's generated document (which knows paths, not bodies: the routes read and
    validate their bodies themselves)."""

    def __init__(self) -> None:
        self.operations: dict[tuple[str, str], Operation] = {}
        self._defs: dict[str, Any] = {}

    def add(self, path: str, method: str, operation: Operation) -> None:
        self.operations[(path, method.lower())] = operation

    def schema(self, kind: Any) -> dict[str, Any]:
        """A JSON schema of `kind`: a type (its models become named components), a schema as
        is (a dict), or SSE events."""
        if isinstance(kind, dict):
            return kind
        if isinstance(kind, SseEvents):
            return {"type": "object", "required": ["data"], "properties": {
                "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"},
                "data": {"anyOf": [{"const": "[DONE]"}, self._json_text(kind.chunk), self._json_text(ErrorResponse)]}}}
        schema = TypeAdapter(kind).json_schema(ref_template=REF, by_alias=True)
        self._defs.update(schema.pop("$defs", {}))
        if isinstance(kind, type) and issubclass(kind, BaseModel):  # a named component, not inlined
            self._defs[kind.__name__] = schema
            return {"$ref": REF.format(model=kind.__name__)}
        return schema

    def _json_text(self, kind: type[BaseModel]) -> dict[str, Any]:
        return {"type": "string", "contentMediaType": JSON, "contentSchema": self.schema(kind)}

    def apply(self, document: dict[str, Any]) -> dict[str, Any]:
        """`document` (FastAPI's) with every operation's bodies; an undocumented route is an error."""
        for path, methods in document.get("paths", {}).items():
            for method, op in methods.items():
                doc = self.operations.get((path, method))
                if doc is None:
                    raise KeyError(f"{method.upper()} {path} has no documented bodies (protocol.Operation)")
                op.pop("requestBody", None)
                if doc.request is not None:
                    op["requestBody"] = {"required": True, "content": {JSON: {"schema": self.schema(doc.request)}}}
                op["responses"] = {
                    str(code): {"description": description,
                                **({"content": {media: {"schema": self.schema(kind)} for media, kind in
                                                content.items() if kind is not None}}
                                   if any(kind is not None for kind in content.values()) else {})}
                    for code, (description, content) in sorted(doc.responses.items())
                }
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's, unused: no route takes a body param
            schemas.pop(name, None)
        schemas.update(self._defs)
        if not schemas:
            document["components"].pop("schemas")
        return document
