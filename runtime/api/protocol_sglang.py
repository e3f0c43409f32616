"""The rest of SGLang's request schema (0.5.23: `GenerateReqInput`, `SamplingParams`, the OpenAI
`CompletionRequest` and `ChatCompletionRequest`), as mixins of the request models in `protocol`.

SGLang's clients, and `sglang-router` above all, send these fields, most of them at their
defaults (`return_hidden_states: false`, `log_metrics: true`, `background: false`, ...). Each
field here is one of two kinds:

  ignored(...)   accepted and without effect here, as in SGLang when the feature it steers is not
                 in use: multimodal knobs (no model served here takes images, audio or video),
                 labels and hints (`session_id`, `routing_key`, `priority` without priority
                 scheduling, `custom_labels`, `kv_hints`), `stream_interval`;
  refused(...)   a feature this server does not have: its SGLang default (null, false, an empty
                 list or object, and any value listed) is accepted; anything else is a 400 that
                 says what is not supported (`return_hidden_states is not supported here (hidden
                 states), got true`).

Besides, a few SGLang fields that this server implements are typed here with their meaning
(`log_metrics`, `stop_regex`, `no_stop_trim`, `continue_final_message`,
`chat_template_kwargs`, `parallel_tool_calls`); the rest of what it implements is in `protocol`.
A field that neither module defines is still refused as unknown. Reasoning fields (`separate_reasoning`, `stream_reasoning`, ...) are not here:
they belong to reasoning separation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError, WithJsonSchema
from pydantic_core import PydanticCustomError

from radixlm.runtime.api.json_types import Int, IntRange, either

_DEFAULTS: tuple[Any, ...] = (None, False, "", [], {})


def refused(kind: Any, what: str, *accepted: Any) -> Any:
    """`kind`, documented and accepted at SGLang's default (or one of `accepted`); any other
    value is a 400 saying `what` is not supported."""

    def check(value: Any) -> Any:
        # `0 == False`: a rank of 0 passes as a default; `True == 1` is excluded by type below
        if any(value == ok and type(value) is type(ok) for ok in _DEFAULTS + accepted):
            return value
        raise PydanticCustomError("unsupported", "is not supported here ({what})", {"what": what})

    shown = ", ".join(repr(v) for v in accepted)
    description = f"SGLang's; not supported here ({what}): only its default{' or ' + shown if shown else ''}"
    # the document lists exactly the values accepted (those of the defaults that are of `kind`)
    adapter = TypeAdapter(kind)
    values = [v for v in _DEFAULTS + accepted if _is_of(adapter, v)]
    return Annotated[kind, AfterValidator(check), WithJsonSchema({"enum": values, "description": description})]


def _is_of(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def ignored(kind: Any, why: str) -> Any:
    """`kind`, documented and accepted; it has no effect here, for the reason `why`."""
    return Annotated[kind, Field(description=f"SGLang's; accepted, no effect here: {why}")]


NO_MEDIA = "no effect without image, audio or video input, which no model served here takes"
MEDIA = "image, audio and video input (the models served here read text)"
PD = "prefill/decode disaggregation"
ONE_RANK = "data parallelism: one rank (0) here"
DP_RANK = Annotated[IntRange(ge=0) | None, Field(description="SGLang's: the data-parallel rank to run on (`radixlm serve "
                                                        "--dp-size N`); a rank the server does not have is a 400")]
CACHE_NAMESPACES = "extra_key: give a cache namespace as cache_salt"
CACHE_SALT = ("SGLang's and vLLM's: salts the prefix cache, so requests with different salts (or none) share no "
              "cached prefix; requests with the same salt share theirs")
Rank = refused(Int | None, ONE_RANK, 0)


class SglangSamplingFields(BaseModel):
    """`sampling_params` of /generate: SGLang's fields that are not ours."""

    beam_width: refused(Int | None, "beam search", 1) = None
    stream_interval: ignored(Int | None, "output is streamed after every step") = None
    logit_bias: refused(dict[str, float] | None, "logit_bias") = None
    custom_params: ignored(dict[str, Any] | None, "read only by a custom logit processor") = None
    watermark: refused(dict[str, Any] | None, "watermarking") = None


SGLANG_SAMPLING_FIELDS = frozenset(SglangSamplingFields.model_fields)


class SglangRequestFields(BaseModel):
    """What /generate and both OpenAI routes share."""

    session_id: ignored(str | None, "a label; the prompt is not changed") = None
    session_params: refused(dict[str, Any] | None, "sessions") = None
    lora_path: refused(str | list[str | None] | None, "LoRA adapters") = None
    custom_logit_processor: refused(str | list[str | None] | None, "custom logit processors") = None
    watermark: refused(dict[str, Any] | None, "watermarking") = None
    return_hidden_states: refused(bool | Literal["last"], "hidden states") = False
    return_routed_experts: refused(bool, "routed experts (no mixture-of-experts model here)") = False
    routed_experts_start_len: ignored(Int, "routed experts are not returned") = 0
    images_config: ignored(dict[str, Any] | None, NO_MEDIA) = None
    mm_processor_kwargs: ignored(dict[str, Any] | None, NO_MEDIA) = None
    bootstrap_host: refused(str | list[str | None] | None, PD) = None
    bootstrap_port: refused(Int | list[Int | None] | None, PD) = None
    bootstrap_room: refused(Int | list[Int | None] | None, PD) = None
    routed_dp_rank: DP_RANK = None
    data_parallel_rank: DP_RANK = None
    disagg_prefill_dp_rank: Rank = None
    extra_key: refused(str | list[str] | None, CACHE_NAMESPACES) = None
    priority: ignored(Int | None, "requests are not scheduled by priority (as in SGLang without "
                                  "--enable-priority-scheduling)") = None
    custom_labels: ignored(dict[str, str] | None, "no custom metric labels are configured") = None


class SglangGenerateFields(SglangRequestFields):
    """POST /generate: the rest of SGLang's `GenerateReqInput` (and `model`, which sglang-router sends)."""

    cache_salt: either(str | list[str] | None, "a string or a list with one per prompt") = Field(
        default=None, description=CACHE_SALT + " (or a list with one per prompt)")

    model: ignored(str | None, "sglang-router's; the one model served here answers") = None
    input_embeds: refused(list[Any] | None, "input embeddings") = None
    image_data: refused(Any, MEDIA) = None
    video_data: refused(Any, MEDIA) = None
    audio_data: refused(Any, MEDIA) = None
    mm_hashes: refused(list[Any] | None, MEDIA) = None
    mm_content_hashes: refused(list[Any] | None, MEDIA) = None
    use_audio_in_video: ignored(bool, NO_MEDIA) = False
    video_config: ignored(dict[str, Any] | None, NO_MEDIA) = None
    modalities: ignored(list[str | None] | None, NO_MEDIA) = None
    max_dynamic_patch: ignored(Int | None, NO_MEDIA) = None
    min_dynamic_patch: ignored(Int | None, NO_MEDIA) = None
    image_max_dynamic_patch: ignored(Int | None, NO_MEDIA) = None
    video_max_dynamic_patch: ignored(Int | None, NO_MEDIA) = None
    token_ids_logprob: refused(list[Any] | None, "log-probabilities of chosen token ids") = None
    return_sampling_mask: refused(bool | list[bool] | None, "sampling masks") = None
    sampling_logprobs_mode: refused(Literal["selected", "support"] | list[Any] | None,
                                    "sampling masks", "selected") = None
    return_flat_raw_top_logprobs: refused(bool, "flat top log-probability arrays") = False
    return_flat_raw_output_top_logprobs: refused(bool, "flat top log-probability arrays") = False
    return_flat_raw_top_logprobs_b64: refused(bool, "flat top log-probability arrays") = False
    log_metrics: bool = Field(default=True, description="false: not counted in /metrics")
    return_indexer_topk: refused(bool, "sparse-attention indexer results") = False
    lora_id: refused(str | list[str | None] | None, "LoRA adapters") = None
    positional_embed_overrides: refused(Any, "embedding overrides") = None
    bootstrap_pair_key: refused(str | list[str | None] | None, PD) = None
    decode_tp_size: refused(Int | list[Int | None] | None, PD) = None
    routing_key: ignored(str | None, "a routing hint; no routing-key policy here") = None
    conversation_id: ignored(str | None, "a label for tracking") = None
    http_worker_ipc: ignored(str | None, "SGLang-internal") = None
    background: refused(bool, "background responses") = False
    no_logs: ignored(bool, "this server never logs request contents") = False
    return_bytes: refused(bool, "image generation") = False
    return_entropy: refused(bool, "entropy") = False
    return_prompt_token_ids: refused(bool, "prompt token ids in the output") = False
    external_trace_header: ignored(dict[str, Any] | None, "no tracing here") = None
    received_time: ignored(float | None, "latency is measured from when this server received the request") = None
    need_wait_for_mm_inputs: refused(bool | None, "encoder disaggregation") = None
    num_items_assigned: refused(dict[str, Any] | None, "encoder disaggregation") = None
    encoder_urls: refused(list[str] | None, "encoder disaggregation") = None
    multi_item_delimiter_indices: refused(list[Any] | None, "multi-item scoring") = None
    token_indices_to_pool: refused(list[Any] | None, "pooling readout") = None
    kv_hints: ignored(dict[str, Any] | list[dict[str, Any] | None] | None, "hints for a hierarchical "
                                                                           "cache, which this server has not") = None


class SglangOpenAIFields(SglangRequestFields):
    """What both OpenAI routes take of SGLang's beyond OpenAI's own fields."""

    stop_regex: either(str | list[str] | None, "a string or a list of strings") = Field(
        default=None, description="as sampling_params.stop_regex of /generate")
    no_stop_trim: bool | None = Field(default=None, description="keep the matched stop string in the output")

    logit_bias: refused(dict[str, float] | None, "logit_bias") = None
    cache_salt: str | None = Field(default=None, description=CACHE_SALT)
    return_cached_tokens_details: ignored(bool, "usage always has prompt_tokens_details.cached_tokens") = False
    return_spec_tokens_details: refused(bool, "speculative decoding") = False
    return_token_ids: refused(bool, "token ids in the output") = False
    custom_params: ignored(dict[str, Any] | None, "read only by a custom logit processor") = None


class SglangCompletionFields(SglangOpenAIFields):
    """POST /v1/completions: the rest of SGLang's `CompletionRequest`."""

    best_of: refused(Int | None, "best_of", 1) = None
    suffix: refused(str | None, "suffix") = None


class SglangChatFields(SglangOpenAIFields):
    """POST /v1/chat/completions: the rest of SGLang's `ChatCompletionRequest`."""

    continue_final_message: bool = Field(default=False, description="the last (assistant) message is continued, "
                                         "not closed: no generation prompt follows it")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="passed to the chat template")
    parallel_tool_calls: bool = Field(default=True, description="false: at most one tool call (the first)")

    return_prompt_token_ids: refused(bool, "prompt token ids in the output") = False
    return_meta_info: refused(bool, "meta info in the output") = False
    return_input_ids_in_sglext: refused(bool, "token ids in the output") = False
    return_output_ids_in_sglext: refused(bool, "token ids in the output") = False
    return_sampling_mask: refused(bool, "sampling masks") = False
    sampling_logprobs_mode: refused(Literal["selected", "support"] | None, "sampling masks", "selected") = None
    return_flat_raw_output_top_logprobs: refused(bool, "flat top log-probability arrays") = False
    return_flat_raw_top_logprobs_b64: ignored(bool, "flat arrays are not returned") = True
    task: refused(str | None, "DeepSeek-V4 quick instructions") = None
    input_ids: refused(list[Int] | None, "a pre-tokenized chat prompt") = None
    max_dynamic_patch: ignored(Int | None, NO_MEDIA) = None
    min_dynamic_patch: ignored(Int | None, NO_MEDIA) = None
    use_audio_in_video: ignored(bool, NO_MEDIA) = False
    video_config: ignored(dict[str, Any] | None, NO_MEDIA) = None
