"""`--kv-events-config` parsed and checked: SGLang's `KVEventsConfig` (same field names and
defaults) plus our `block_size`, and the endpoint each data-parallel rank publishes on. What the
events are and how they are published: mem_cache/kv_events.py, scheduler/kv_events_publisher.py."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

DEFAULT_BLOCK_SIZE = 16
PUBLISHERS = ("null", "zmq")


def endpoint_for_rank(endpoint: str, dp_rank: int) -> str:
    """The endpoint data-parallel rank `dp_rank` uses: tcp ports offset by the rank."""
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + dp_rank}"
    raise ValueError(f"with data parallelism the KV events endpoint must be tcp:// or inproc://, got {endpoint!r}")


@dataclass(frozen=True)
class KVEventsConfig:
    """SGLang's KVEventsConfig fields (same names and defaults), plus our `block_size`."""

    publisher: str = "null"  # "zmq" publishes; "null" records nothing
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's send high-water mark (zmq drops past it)
    max_queue_size: int = 100_000  # batches waiting for the publisher thread
    topic: str = ""
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens per published block (radixlm's; SGLang: its page size)

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        """Parse the flag's JSON object; anything unknown or mistyped is a ValueError naming it."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--kv-events-config is not valid JSON ({e}): {text!r}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"--kv-events-config must be a JSON object, got {text!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise ValueError(f"--kv-events-config: unknown key(s) {', '.join(unknown)}; known: {', '.join(fields)}")
        for name, value in raw.items():
            kind = str(fields[name].type)
            ok = isinstance(value, str) if kind.startswith("str") else \
                isinstance(value, int) and not isinstance(value, bool)
            if not (ok or (value is None and kind.endswith("None"))):
                raise ValueError(f"--kv-events-config: {name} must be {kind.replace(' | None', ' or null')}, got {value!r}")
        return cls(**raw)

    def __post_init__(self) -> None:
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"--kv-events-config: publisher must be one of {', '.join(PUBLISHERS)}, got {self.publisher!r}")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"--kv-events-config: {name} must be a tcp://, ipc:// or inproc:// address, got {value!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--kv-events-config: {name} must be >= 1, got {getattr(self, name)}")

    @property
    def is_enabled(self) -> bool:
        return self.publisher == "zmq"
