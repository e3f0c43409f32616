"""The contract both front doors serve, the in-process Engine and the HTTP server, and the one
door they share:

- `protocol`, `protocol_sglang`, `json_types`: the typed request and response bodies (native
  /generate and OpenAI), SGLang's whole request schema, /openapi.json built from them;
- `request_io`: a request in: body or Engine keywords -> `n` copies with their seeds ->
  validated, tokenized `PreparedRequest`s;
- `request_output`: a result out: the detokenizer's deltas appended once -> /generate results
  and stream chunks;
- `errors`: `RequestError`, the message and status a bad request gets from either door.

In: `config/` (limits), `tokenizer/`, `sampling/` (SamplingParams and its ranges),
`constrained/` (a grammar's quick check and lowering), `ipc/` (the output deltas). Nothing of the
model or the scheduler: the contract does not depend on how it is served.
"""
