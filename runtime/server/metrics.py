"""Server metrics in the Prometheus text format (no client library: counters and histograms are
a few numbers each). Updated by the tokenizer manager; gauges are read from the scheduler's info
when /metrics is scraped.

Contract of the output (tests/server/test_metrics_format.py parses it with prometheus_client):
every sample carries the same label set, `model_name` (escaped: any served name parses back
exactly), and no two families share a name once a parser folds a counter's `_total` and a
histogram's `_bucket` / `_sum` / `_count` into their family (so no gauge may be called `X` next to
a counter `X_total`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Counts(Protocol):
    """A request's token counts (a RequestOutput)."""

    completion_tokens: int
    cached_tokens: int


def escape_label_value(value: str) -> str:
    """A label value as the text exposition format writes it between double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text as the text exposition format writes it (backslash and newline escaped)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value`."""
        self.total += value * count
        self.count += count
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += count

    def render(self, name: str, help_text: str, labels: str) -> list[str]:
        """`labels`: the rendered common labels (`model_name="..."`), escaped already."""
        lines = [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        lines += [f'{name}_bucket{{{labels},le="+Inf"}} {self.count}', f"{name}_sum{{{labels}}} {self.total}",
                  f"{name}_count{{{labels}}} {self.count}"]
        return lines


@dataclass
class Metrics:
    model_name: str
    requests_started: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))

    def on_request_start(self, prompt_tokens: int) -> None:
        self.requests_started += 1
        self.prompt_tokens += prompt_tokens

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_token(self, seconds: float, num_tokens: int = 1) -> None:
        """`num_tokens` arrived together `seconds` after the previous ones: each counts the mean gap."""
        self.itl.observe(seconds / num_tokens, num_tokens)

    def on_request_end(self, counts: _Counts, aborted: bool) -> None:
        if aborted:
            self.requests_aborted += 1
        else:
            self.requests_finished += 1
        self.generation_tokens += counts.completion_tokens
        self.cached_tokens += counts.cached_tokens

    def render(self, info: dict[str, Any] | None) -> str:
        labels = f'model_name="{escape_label_value(self.model_name)}"'
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            lines.extend([f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} {kind}",
                          f"{name}{{{labels}}} {value}"])

        metric("radixlm_requests_total", "counter", "Generation requests received", self.requests_started)
        metric("radixlm_requests_finished_total", "counter", "Requests that finished", self.requests_finished)
        metric("radixlm_requests_aborted_total", "counter", "Requests aborted (client gone or abort call)", self.requests_aborted)
        metric("radixlm_prompt_tokens_total", "counter", "Prompt tokens received", self.prompt_tokens)
        metric("radixlm_generation_tokens_total", "counter", "Tokens generated", self.generation_tokens)
        metric("radixlm_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache", self.cached_tokens)
        if info is not None:
            pool, cache, max_total_num_tokens = info["kv_pool"], info["radix_cache"], info["max_total_num_tokens"]
            used = max_total_num_tokens - pool["free_tokens"]
            metric("radixlm_num_running_reqs", "gauge", "Requests running", info["num_running_reqs"])
            metric("radixlm_num_waiting_reqs", "gauge", "Requests waiting", info["num_waiting_reqs"])
            metric("radixlm_kv_pool_total_tokens", "gauge", "KV pool size in tokens", max_total_num_tokens)
            metric("radixlm_kv_pool_used_tokens", "gauge", "KV pool slots in use (cache + running)", used)
            metric("radixlm_kv_pool_usage", "gauge", "Share of the KV pool in use", used / max(1, max_total_num_tokens))
            metric("radixlm_cache_hit_rate", "gauge", "Prefix cache hit rate (tokens)", cache["hit_rate"])
            metric("radixlm_radix_cache_tokens", "gauge", "Tokens held by the radix cache", cache["tree_tokens"])
            metric("radixlm_evicted_tokens_total", "counter", "Cached tokens evicted to make room",
                   cache["num_evicted_tokens"])
            metric("radixlm_retractions_total", "counter", "Decoding requests retracted (KV pool full)", info["num_retractions"])
        lines += self.ttft.render("radixlm_time_to_first_token_seconds", "Time to first token", labels)
        lines += self.itl.render("radixlm_inter_token_latency_seconds", "Time between output tokens", labels)
        return "\n".join(lines) + "\n"
