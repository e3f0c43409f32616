"""KV memory: `mem_pool` (ReqToTokenPool: request slot -> token positions; KVPool: token slot ->
K/V per layer, a free-list allocator over a preallocated buffer) and `radix_cache` (token-id
sequences -> KV slot indices, LRU eviction of unlocked leaves), whose changes `kv_events` turns
into SGLang / vLLM KV events (stored / removed / cleared blocks). Knows nothing of requests,
models or HTTP; the scheduler's cache bridge connects requests to it.
"""
