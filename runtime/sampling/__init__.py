"""Sampling: `sampling_params` (the one validated, frozen SamplingParams that crosses every
process) and `sampler` (logits + per-request params + grammar masks in, token ids and logprobs
out: greedy, temperature, top-k/p, min-p, penalties, seeds).
"""
