"""The main process: HTTP in, text out.

In: HTTP requests (`http_server`: SGLang's native API; `openai_api`: the OpenAI routes), checked
at the door (`radixlm.runtime.api.request_io`) and tokenized by the `TokenizerManager`, which sends
`messages.TokenizedGenerateReq` to the scheduler process. Out: the detokenizer's
`messages.BatchStrOut` deltas, appended per request and streamed (SSE) or returned whole.
`serve` starts the three processes, `cli` is the `radixlm` command, `metrics` the Prometheus text;
`replicas` starts several servers behind sglang-router (`make serve-replicas`).
"""
