"""What every layer of the runtime reads, defined once: `server_args` (every setting and flag,
with its choices, checked when built), `envs` (every `RADIXLM_` environment variable, typed, read
when needed), `limits` (every bound on one request, refused at the door) and `kv_events_config`
(`--kv-events-config` parsed and checked). Imports nothing of the runtime, so any unit can read it.
"""
