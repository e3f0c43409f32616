"""The main process: HTTP in, text out.

In: HTTP requests (`http_server`: the app; its route modules `native_api`: SGLang's native API,
`openai_api`: the OpenAI routes, `dashboard`, `traces`, which share `http_common`), checked
at the door (`radixlm.runtime.api.request_io`) and tokenized by the `TokenizerManager`, which sends
`messages.TokenizedGenerateReq` to the scheduler process. Out: the detokenizer's
`messages.BatchStrOut` deltas, appended per request and streamed (SSE) or returned whole.
`serve` starts the three processes, `cli` is the `radixlm` command, `metrics` the Prometheus text;
`replicas` starts several servers behind sglang-router (`make serve-replicas`).
"""
