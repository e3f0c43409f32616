"""All runtime settings in one frozen dataclass (SGLang's names), built once per Engine / server.

Derived values are properties; nothing is assigned after construction. The command-line parser
(one `add_cli_args` / `from_cli_args` pair) lives here too, so every flag is defined once, with its
choices. A bad setting fails here, at startup; the checks need nothing of the runtime above the
config (the grammar backends and the KV events publisher read their settings from here).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from radixlm.formats.reasoning import REASONING_PARSERS
from radixlm.formats.tool_formats import TOOL_CALL_PARSERS
from radixlm.runtime.config import envs
from radixlm.runtime.config.envs import RADIXLM_AUTO_QUANTIZATION, RADIXLM_CPU_AUTO_DTYPE
from radixlm.runtime.config.kv_events_config import KVEventsConfig, endpoint_for_rank
from radixlm.runtime.config.speculative_config import SPECULATIVE_ALGORITHMS, SpeculativeConfig

if TYPE_CHECKING:  # torch and the kernels load where they run, not in every process that reads settings
    from collections.abc import Callable

    import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")
# auto: a GGUF's Q8_0 / Q4_0 / Q4_1 weights are kept as they are when --dtype is auto, none: every
# weight in --dtype; gguf: keep them (an error for a model without); the rest quantize float
# weights at load (kernels/quant.py).
QUANTIZATIONS = ("auto", "none", "gguf", "q8_0", "q4_0", "q4_1", "w8a8_int8")
QUANTIZED_ACTIVATIONS = ("auto", "float32", "int8")
# Refused rather than half-working: no GPU has ever run this code, and these parts still create
# their tensors on the CPU or size memory from the host.
CUDA_REFUSAL = (
    "--device cuda is not supported yet: the forward batch (runtime/model/forward_batch.py), the torch "
    "attention backend's metadata, the scheduler's logits indices and grammar masks, and the sampler's "
    "parameter tensors are created on the CPU, and the KV pool is sized from host memory, not the "
    "GPU's; run with --device cpu"
)
ATTENTION_BACKENDS = ("torch", "triton")
GRAMMAR_BACKENDS = ("outlines", "xgrammar", "llguidance")  # what each serves: constrained/backends.py
# The default: most schemas of the corpus compiled and served (runtime/bench/grammar.py), then mask p99.
DEFAULT_GRAMMAR_BACKEND = "xgrammar"
SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")
# --load-balance-method: SGLang's values and ours (prefix_affinity, the default; server/load_balance.py)
LOAD_BALANCE_METHODS = ("prefix_affinity", "round_robin", "total_requests", "total_tokens")


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = None  # None: the embedded default model (SmolLM2-135M-Instruct)
    tokenizer_path: str | None = None  # None: the model directory
    dtype: str = "auto"
    quantization: str = "auto"
    quantized_activations: str = "auto"
    device: str = "cpu"
    attention_backend: str | None = None  # None: torch on CPU, triton on CUDA
    context_length: int | None = None  # None: the model's own
    max_total_tokens: int | None = None  # KV pool size in tokens; None: from mem_fraction_static
    mem_fraction_static: float = 0.05  # of available memory given to the KV pool (CPU)
    max_running_requests: int = 256
    chunked_prefill_size: int = 2048
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    disable_jump_forward: bool = False
    constrained_json_whitespace_pattern: str | None = None  # outlines only; None: outlines-core's `[ ]?`
    grammar_backend: str = DEFAULT_GRAMMAR_BACKEND
    grammar_compile_memory_mb: int | None = None  # one large grammar compile's budget; None: a quarter of the RAM
    disable_cpu_kernels: bool = False
    disable_adaptive_threads: bool = False
    enable_deterministic_inference: bool = False  # a request's results never depend on the requests beside it
    random_seed: int | None = None
    speculative_algorithm: str | None = None  # None: NGRAM for constrained requests; NONE: off (speculative_config)
    speculative_num_draft_tokens: int = SpeculativeConfig.num_draft_tokens
    speculative_ngram_min_match_window_size: int = SpeculativeConfig.ngram_min_match_window_size
    speculative_ngram_max_match_window_size: int = SpeculativeConfig.ngram_max_match_window_size
    speculative_ngram_capacity: int = SpeculativeConfig.ngram_capacity
    speculative_draft_model_path: str | None = None  # STANDALONE: the draft model
    log_level: str = "warning"
    # the HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    chat_template: str | None = None  # a Jinja template file or string; default: the tokenizer's
    served_model_name: str | None = None  # the model id in the OpenAI API; default: the model's name
    tool_call_parser: str = "auto"
    reasoning_parser: str | None = None  # None: outputs are not split into reasoning and answer
    response_store_size: int = 1000  # /v1/responses kept for GET and previous_response_id (LRU)
    enable_metrics: bool = True
    incremental_streaming_output: bool = False  # stream chunks carry new text / ids only
    stream_interval: int = 1  # a streaming request's output leaves the scheduler every this many tokens
    timeout_header: float = 10.0  # seconds to receive a request line and headers
    timeout_body: float = 30.0  # seconds a request body may go without a byte
    timeout_request: float = 30.0  # seconds from a request's first byte to its last (head and body)
    max_connections: int = 512  # open HTTP connections; one more gets 503
    kv_events_config: str | None = None  # SGLang's JSON form (KVEventsConfig); None: no KV events
    dp_size: int = 1  # scheduler processes (each its own KV pool and radix cache) behind one HTTP front
    load_balance_method: str = "prefix_affinity"  # which rank a request goes to when dp_size > 1
    tp_size: int = 1  # tensor parallelism: ranks (processes) each holding 1/N of the heads, MLP and KV pool

    def __post_init__(self) -> None:
        if self.device != "cpu":
            raise ValueError(CUDA_REFUSAL if self.device.startswith("cuda") else f"device must be cpu, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quantized_activations not in QUANTIZED_ACTIVATIONS:
            raise ValueError(f"quantized_activations must be one of {', '.join(QUANTIZED_ACTIVATIONS)}, "
                             f"got {self.quantized_activations!r}")
        if self.quantization == "w8a8_int8" and self.quantized_activations == "float32":
            raise ValueError("w8a8_int8 quantizes activations to int8; use --quantization q8_0 for int8 weights "
                             "with float32 activations")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            raise ValueError(f"max_total_tokens must be >= 16, got {self.max_total_tokens}")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.chunked_prefill_size < 16:
            raise ValueError(f"chunked_prefill_size must be >= 16, got {self.chunked_prefill_size}")
        if self.response_store_size < 0:
            raise ValueError(f"response_store_size must be >= 0, got {self.response_store_size}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("timeout_header", "timeout_body", "timeout_request"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"grammar_backend must be one of {', '.join(GRAMMAR_BACKENDS)}, got {self.grammar_backend!r}")
        if self.grammar_compile_memory_mb is not None and self.grammar_compile_memory_mb < 1:
            raise ValueError(f"grammar_compile_memory_mb must be >= 1, got {self.grammar_compile_memory_mb}")
        if self.constrained_json_whitespace_pattern is not None and self.grammar_backend != "outlines":
            raise ValueError("constrained_json_whitespace_pattern applies to the outlines grammar backend only "
                             f"(grammar_backend is {self.grammar_backend}); add --grammar-backend outlines")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}")
        if self.constrained_json_whitespace_pattern is not None:
            check_whitespace_pattern(self.constrained_json_whitespace_pattern)
        if self.kv_events_config is not None:
            KVEventsConfig.from_json(self.kv_events_config)  # a bad config fails here, at startup
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.load_balance_method not in LOAD_BALANCE_METHODS:
            raise ValueError(f"load_balance_method must be one of {', '.join(LOAD_BALANCE_METHODS)}, "
                             f"got {self.load_balance_method!r}")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.tp_size > 1 and self.dp_size > 1:
            raise ValueError(f"--tp-size {self.tp_size} with --dp-size {self.dp_size}: data and tensor parallelism "
                             "together are not supported; use one of them")
        if self.dp_size > 1 and self.kv_events is not None:
            for endpoint in (self.kv_events.endpoint, self.kv_events.replay_endpoint):
                if endpoint is not None:
                    endpoint_for_rank(endpoint, 1)  # a ValueError names what data parallelism needs
        _ = self.speculative  # a bad speculative setting fails here, at startup
        if self.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError(f"log_level must be debug, info, warning, error or critical, got {self.log_level!r}")

    @property
    def resolved_attention_backend(self) -> str:
        if self.attention_backend is not None:
            return self.attention_backend
        return "triton" if self.device.startswith("cuda") else "torch"

    def torch_dtype(self, cpu_prefers_bf16: Callable[[], bool]) -> torch.dtype:
        """`auto`: bfloat16 on CUDA; on CPU bfloat16 where `cpu_prefers_bf16()` (the model layer
        passes `cpu_linear.prefers_bf16` over its kernels: AVX512-BF16 and a batched bf16 product
        measured 1.25x float32's), float32 elsewhere (torch's software bf16 prefills slower);
        RADIXLM_CPU_AUTO_DTYPE overrides the CPU choice, and then `cpu_prefers_bf16` is
        not called. docs/cpu-support.md, "What `auto` picks"."""
        import torch

        if self.dtype != "auto":
            return getattr(torch, self.dtype)
        if self.device.startswith("cuda"):
            return torch.bfloat16
        forced = RADIXLM_CPU_AUTO_DTYPE.get()
        if forced is not None:
            if forced not in ("float32", "bfloat16"):
                raise ValueError(f"RADIXLM_CPU_AUTO_DTYPE must be float32 or bfloat16, got {forced!r}")
            return getattr(torch, forced)
        return torch.bfloat16 if cpu_prefers_bf16() else torch.float32

    @property
    def resolved_quantization(self) -> str:
        """`auto`: "auto" (keep a GGUF's quantized weights, if the model has any) when --dtype is
        auto, else "none" (an explicit --dtype asks for float weights); RADIXLM_AUTO_QUANTIZATION
        overrides it."""
        if self.quantization != "auto":
            return self.quantization
        forced = RADIXLM_AUTO_QUANTIZATION.get()
        if forced is not None:
            if forced not in QUANTIZATIONS:
                raise ValueError(f"RADIXLM_AUTO_QUANTIZATION must be one of {', '.join(QUANTIZATIONS)}, got {forced!r}")
            return forced
        return "auto" if self.dtype == "auto" else "none"

    def quant_mode(self, int8_dot_is_fast: bool) -> str:
        """How quantized layers multiply (kernels/quant.py MODES): w8a8_int8 int8 per token; else
        --quantized-activations, whose `auto` is int8 per 32-block where the CPU multiplies int8
        in hardware (`int8_dot_is_fast`: the model layer's kernel_policy), float32 elsewhere."""
        if self.quantization == "w8a8_int8":
            return "int8_row"
        if self.quantized_activations != "auto":
            return self.quantized_activations
        return "int8" if int8_dot_is_fast else "float32"

    @property
    def kv_events(self) -> KVEventsConfig | None:
        """The parsed --kv-events-config when it publishes, else None (no recording at all)."""
        if self.kv_events_config is None:
            return None
        config = KVEventsConfig.from_json(self.kv_events_config)
        return config if config.is_enabled else None

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The speculative decoding settings: None with --speculative-algorithm NONE; unset, NGRAM
        for the requests under a grammar only (speculative_config.SPECULATIVE_ALGORITHMS)."""
        algorithm = self.speculative_algorithm
        if algorithm in (None, "NONE") and self.speculative_draft_model_path:
            raise ValueError("--speculative-draft-model-path is used by --speculative-algorithm STANDALONE only "
                             f"(the algorithm is {algorithm or 'unset'})")
        if algorithm == "NONE":
            return None
        return SpeculativeConfig(algorithm or "NGRAM", self.speculative_num_draft_tokens,
                                 self.speculative_ngram_min_match_window_size,
                                 self.speculative_ngram_max_match_window_size, self.speculative_ngram_capacity,
                                 self.speculative_draft_model_path, constrained_only=algorithm is None)

    def replace(self, **changes: object) -> ServerArgs:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def public_dict(self) -> dict[str, object]:
        """Every setting a client may see: all but the secrets (SECRET_FIELDS), e.g. for
        /get_server_info. A secret's presence shows as a boolean `has_<name>`."""
        public: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                public[f"has_{f.name}"] = value is not None
            else:
                public[f.name] = value
        return public


# Settings no endpoint, log line or error message may show.
SECRET_FIELDS = frozenset({"api_key"})


def check_whitespace_pattern(pattern: str) -> None:
    """ValueError unless `pattern` is a regex whose every match is JSON whitespace (space, tab,
    newline, carriage return), so that it can stand between the tokens of a JSON text."""
    import interegular  # the regex's language as an FSM; loaded only for this setting

    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid JSON whitespace pattern {pattern[:80]!r}: {e}") from None
    try:
        matches = interegular.parse_pattern(pattern).to_fsm()
    except Exception as e:  # interegular's own parse errors: constructs it does not support
        raise ValueError(f"JSON whitespace pattern {pattern!r} cannot be checked: {e}") from None
    if not matches.difference(interegular.parse_pattern(r"[ \t\n\r]*").to_fsm()).empty():
        raise ValueError(f"JSON whitespace pattern {pattern!r} matches more than spaces, tabs and newlines")


HELP = {
    "constrained_json_whitespace_pattern": "regex of the whitespace JSON-schema output may put between JSON tokens "
    "(default [ ]?; '' gives compact JSON, where jump-forward forces every key); it may match only spaces, tabs and newlines",
    "model_path": "HF model directory (safetensors, sharded or not), .gguf file (or the first shard of a split "
    "one), or a directory holding one GGUF (default: the embedded SmolLM2-135M-Instruct)",
    "tokenizer_path": "tokenizer directory (default: the model's)",
    "dtype": "weights and KV cache: auto (bfloat16 on CUDA, and on CPUs with AVX512-BF16 where a timed 64-row product with "
    "bf16 weights runs 1.25x float32's; else float32), float32, bfloat16, float16",
    "quantization": "linear weights: auto (a GGUF's Q8_0 / Q4_0 / Q4_1 tensors kept as they are when --dtype is auto, "
    "as for the default model; other weights in --dtype), none (all in --dtype), gguf (keep them; an error for a model "
    "without), q8_0 / q4_0 / q4_1 (GGUF's block formats) or w8a8_int8 (per-channel int8 weights, per-token int8 "
    "activations): quantize float weights at load",
    "quantized_activations": "how quantized layers multiply: int8 (x quantized per 32 values, int8 dot products with "
    "AVX512-VNNI, as llama.cpp), float32 (weight-only: exact products of the stored weights), auto (int8 where the CPU "
    "has VNNI)",
    "device": "cpu (cuda is refused until every tensor follows the device)",
    "attention_backend": "torch (CPU default) or triton (CUDA default)",
    "context_length": "longest prompt + output (default: the model's)",
    "max_total_tokens": "KV pool size in tokens (default: from --mem-fraction-static); /get_server_info shows the "
    "size in effect as max_total_num_tokens (SGLang's name)",
    "mem_fraction_static": "share of available memory for the KV pool when --max-total-tokens is unset",
    "max_running_requests": "requests decoding at once",
    "chunked_prefill_size": "prompt tokens computed per step; longer prompts are split across steps",
    "schedule_policy": "waiting-queue order: lpm (longest cached prefix first), dfs-weight, fcfs, lof, random",
    "disable_radix_cache": "use a prefix cache that matches nothing",
    "disable_jump_forward": "constrained requests decode the text their grammar forces token by token, "
    "instead of checking all its tokens in one forward (same output, slower)",
    "random_seed": "seed of the sampler for requests without their own seed",
    "speculative_algorithm": "speculative decoding: NGRAM drafts each request's next tokens from its own prompt and "
    "output (prompt lookup: the tokens that followed the latest earlier occurrence of its last tokens), else from "
    "earlier requests' outputs (--speculative-ngram-capacity); STANDALONE "
    "drafts them greedily with a smaller model of the same vocabulary (--speculative-draft-model-path). Drafts are "
    "cut where the request's grammar refuses, after the tokens jump-forward forces; one forward checks them all and "
    "keeps them as far as sampling agrees, so outputs are unchanged (greedy: identical). NGRAM wins where outputs "
    "copy the prompt (extraction); meta_info reports spec_verify_ct and spec_accept_length. NONE: no drafts. "
    "Default: NGRAM for the requests under a grammar (JSON schema, regex, EBNF, tool calls), where it wins, and "
    "none for free text",
    "speculative_num_draft_tokens": "with --speculative-algorithm: tokens drafted per request per step on a fresh "
    "match; a copy that keeps being accepted doubles it, up to 15 (NGRAM), misses halve it, and a step's rows are "
    "kept within 16 (a large batch is compute-bound)",
    "speculative_draft_model_path": "with --speculative-algorithm STANDALONE: the draft model (what --model-path "
    "takes); its vocabulary must be the target's. It runs in the scheduler process with its own KV pool, as many "
    "tokens as the target's",
    "speculative_ngram_min_match_window_size": "with NGRAM: the last this many tokens must occur earlier for a draft",
    "speculative_ngram_max_match_window_size": "with NGRAM: earlier occurrences are ranked by how many tokens (up to "
    "this many) before them agree with the sequence's end; the latest of the best is drafted from",
    "speculative_ngram_capacity": "with NGRAM: tokens of earlier requests' outputs kept (oldest dropped first) to "
    "draft from when a request's own prompt and output have no match: requests of one schema repeat their keys, "
    "formats and closings (0: own text only). /flush_cache empties it. 100,000 tokens of extraction outputs take "
    "~8 MB; ~95 MB if no n-gram repeats",
    "log_level": "debug, info (one line per request), warning (default), error",
    "host": "address to bind (default 127.0.0.1: this machine only)",
    "port": "port to bind",
    "api_key": "require 'Authorization: Bearer KEY' on every endpoint but /health",
    "chat_template": "Jinja chat template (file path or the template itself) for chat requests",
    "served_model_name": "model id reported by /v1/models and accepted in requests",
    "tool_call_parser": "the format tool calls are read in under tool_choice auto (SGLang's names): hermes (<tool_call> "
    "blocks, our tools prompt's), qwen25 (the same, Qwen2.5 / Qwen3 templates), llama3 ({\"name\", \"parameters\"} JSON), "
    "mistral ([TOOL_CALLS] [...]), pythonic ([f(a=1)]), json (a bare JSON call); auto: the one the chat template "
    "teaches, else hermes, then a bare JSON call",
    "reasoning_parser": "how a reasoning model's <think> text is told from its answer (SGLang's names): deepseek-r1 "
    "(the output starts inside the reasoning), qwen3 (reasoning only after an opening <think>), qwen3-thinking, kimi; "
    "chat responses then carry reasoning_content, and grammars apply only after the reasoning ends (default: none)",
    "response_store_size": "responses of /v1/responses kept in memory (those created with store true, OpenAI's "
    "default) for GET /v1/responses/{id} and previous_response_id; past this many the least recently used is dropped "
    "(0: none kept; default 1000)",
    "enable_metrics": "serve Prometheus metrics at /metrics",
    "incremental_streaming_output": "native stream chunks carry only their new text and output_ids "
    "(default: cumulative, as SGLang streams them)",
    "stream_interval": "a streaming request's new tokens are sent every this many (its first token and its end at "
    "once); larger: fewer, larger stream chunks and less work per token beside the forwards (default 1)",
    "timeout_header": "seconds a client has to send a request's line and headers, counted from the connection's "
    "opening (or, on a keep-alive connection, from the request's first byte); then the connection is closed, "
    "with a 408 if part of them arrived (default 10)",
    "timeout_body": "seconds a request body may go without receiving a byte (an idle time, so a slow but steady "
    "upload still works); then 408 and the connection is closed (default 30)",
    "timeout_request": "seconds a client has to send a whole request, its line, headers and body, counted from "
    "its first byte: an overall deadline, so a request trickled a byte at a time cannot hold its connection "
    "however short its pauses; then 408 (if no response has started) and the connection is closed (default 30)",
    "max_connections": "HTTP connections open at once, idle and half-sent ones included; a connection opened while "
    "this many are open gets 503 at once and is closed (default 512; uvicorn's limit_concurrency is not used: it counts "
    "open connections and running requests only when a request arrives, and refuses whichever request asks)",
    "disable_cpu_kernels": "run decode steps as torch ops instead of the C++ CPU kernels (DecodeStack, packed linear)",
    "enable_deterministic_inference": "batch-invariant attention on the C++ CPU kernels: no cascade over a prefix several "
    "requests share, each request attended on its own, so a request's logits do not depend on which requests run "
    "beside it (speculative decoding then gives the tokens and logprobs it gives without, in any batch); costs the "
    "cascade's saving where many requests share a long prefix",
    "grammar_backend": "compiles regex / JSON-schema / EBNF constraints: outlines (token DFA; no EBNF, recursive $ref "
    "expanded 3 times per path), xgrammar (the default) or llguidance (context-free: EBNF via `ebnf`, recursive $ref to any depth); "
    "all close output within max_new_tokens",
    "grammar_compile_memory_mb": "memory one large xgrammar grammar compile may take (MB): such compiles (a serialized "
    "grammar of 1 MiB or more, e.g. from a schema of ~80 KB of optional properties) run one at a time in a child "
    "process capped at this much above its start-up size; one that needs more fails its request with 400 'schema "
    "compile exceeded the N MB budget' (default: a quarter of the machine's memory)",
    "kv_events_config": "publish the radix cache's stored / removed / cleared blocks over zmq, as SGLang and vLLM "
    "do: a JSON object with SGLang's keys, e.g. '{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", "
    "\"topic\": \"kv-events\"}' (also replay_endpoint, buffer_steps, hwm, max_queue_size) and block_size "
    "(tokens per published block, default 16); docs/scaling-out.md, \"KV events\"",
    "dp_size": "data parallelism: N scheduler processes behind one HTTP front, each with its own KV pool and "
    "radix cache (on CPU each gets cores / N torch threads); /get_load and /server_info report each rank",
    "load_balance_method": "which rank a request goes to when --dp-size > 1: prefix_affinity (default: the rank "
    "whose cache most likely holds the prompt's prefix, the least loaded one when none does or that rank is "
    "overloaded), round_robin, total_requests (fewest requests in flight), total_tokens (fewest prompt tokens in flight)",
    "tp_size": "tensor parallelism: N ranks (processes, torch.distributed: gloo on CPU), each holding 1/N of the "
    "attention heads (split by KV group), of the MLP and of the KV pool, one all-reduce after the attention output "
    "and one after the MLP (on CPU through shared memory when small); the scheduler runs on rank 0. The model's KV "
    "heads, query heads and MLP width must divide by N",
    "disable_adaptive_threads": "on CPU, keep torch's thread count fixed instead of using only the cores other processes "
    "leave free (runtime/model/cpu_threads.py)",
}


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerArgs field, SGLang's names (`--model-path`, ...); types from annotations."""
    choices = {"dtype": DTYPES, "quantization": QUANTIZATIONS, "quantized_activations": QUANTIZED_ACTIVATIONS,
               "attention_backend": ATTENTION_BACKENDS, "schedule_policy": SCHEDULE_POLICIES,
               "tool_call_parser": TOOL_CALL_PARSERS, "grammar_backend": GRAMMAR_BACKENDS,
               "reasoning_parser": REASONING_PARSERS, "load_balance_method": LOAD_BALANCE_METHODS,
               "speculative_algorithm": SPECULATIVE_ALGORITHMS}
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        annotation = str(f.type)
        if annotation == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=HELP[f.name])
            continue
        kind = int if annotation.startswith("int") else float if annotation.startswith("float") else str
        parser.add_argument(flag, type=kind, default=f.default, choices=choices.get(f.name), help=HELP[f.name])


def from_cli_args(args: argparse.Namespace) -> ServerArgs:
    return ServerArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)})


# The settings page (docs/settings.md) holds what `settings_markdown()` renders between these markers;
# tests/test_docs.py fails when the two differ.
DOCS_BEGIN = "<!-- generated: settings -->"
DOCS_END = "<!-- end generated -->"
DOCS_COMMAND = "python -m radixlm.runtime.config.server_args --markdown docs/settings.md"


def _markdown_item(head: str, text: str) -> list[str]:
    """One list item, wrapped at 100 columns (never inside a word); a `<` outside code spans is
    escaped, so that `<think>` shows as text rather than as an HTML tag."""
    text = "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(text.split("`")))
    return textwrap.wrap(f"- {head}: {text}", width=100, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def _default_text(value: object) -> str:
    if value is None:
        return "unset"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _env_descriptions() -> dict[str, str]:
    """The comment block right above each `RADIXLM_X = Env...(...)` line of envs.py: its description."""
    descriptions: dict[str, str] = {}
    block: list[str] = []
    for line in inspect.getsource(envs).splitlines():
        if line.startswith("#"):
            block.append(line.lstrip("#").strip())
            continue
        name = line.partition(" = ")[0]
        if block and name.startswith("RADIXLM_"):
            descriptions[name] = " ".join(block)
        block = []
    return descriptions


def settings_markdown() -> str:
    """The generated part of docs/settings.md: every ServerArgs field (flag, default, HELP) and every
    environment variable of runtime/config/envs.py (name, default, the comment above it)."""
    lines = ["### Flags", ""]
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        lines += _markdown_item(f"`{flag}` (`{f.name}`, default {_default_text(f.default)})", HELP[f.name])
    lines += ["", "### Environment variables", ""]
    descriptions = _env_descriptions()
    for name, value in vars(envs).items():
        if name.startswith("RADIXLM_") and getattr(value, "name", None) == name:  # EnvStr, EnvFloat, ...
            default = _default_text(getattr(value, "default", None))
            lines += _markdown_item(f"`{name}` (default {default})", descriptions.get(name, ""))
    return "\n".join(lines) + "\n"


def write_settings_doc(path: Path) -> None:
    """Replace what lies between DOCS_BEGIN and DOCS_END in `path` with `settings_markdown()`."""
    text = path.read_text()
    head, begin, rest = text.partition(DOCS_BEGIN + "\n")
    _, end, tail = rest.partition(DOCS_END)
    if not begin or not end:
        raise ValueError(f"{path} lacks the markers {DOCS_BEGIN} ... {DOCS_END}")
    path.write_text(head + begin + settings_markdown() + end + tail)


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixlm.runtime.config.server_args",
                                     description="Render the settings page's generated part.")
    parser.add_argument("--markdown", nargs="?", const="-", required=True, metavar="FILE",
                        help="print it, or with FILE (docs/settings.md) rewrite it between the markers")
    args = parser.parse_args(argv)
    if args.markdown == "-":
        sys.stdout.write(settings_markdown())
    else:
        write_settings_doc(Path(args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
