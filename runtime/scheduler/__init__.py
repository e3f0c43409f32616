"""The scheduler process: tokenized requests in, sampled token ids out.

In: `messages.TokenizedGenerateReq` (and abort / flush / info) from the TokenizerManager, or
`add_request` from the in-process Engine. `Scheduler.step()` admits waiting requests
(`schedule_policy` orders them, `admission` does the token budget, `cache_bridge` matches and
locks their prefixes in `mem_cache`), runs one `model` forward, samples (`sampling`), applies
grammars (`constrained`), checks finish, and records logprobs (`logprobs`). Out: new token ids
per request (`messages.BatchTokenIDOut`) to the detokenizer. `req` is the request's state;
`scheduler_process` is the zmq loop around the plain `Scheduler` object.
"""
