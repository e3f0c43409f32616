"""What every layer of the runtime reads, defined once: `envs` (every `RADIXLM_` environment
variable, typed, read when needed) and `limits` (every bound on one request, refused at the door).
Imports nothing of the runtime, so any unit can read it.
"""
