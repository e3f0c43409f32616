"""OpenAI: a program's backend over any OpenAI-compatible server, through the official `openai`
client (`pip install radixlm[openai]`; imported only when an OpenAI backend is made).

How program steps map onto the API, and what it cannot express:
- gen on a chat model (the default): the gen must open an assistant message, as in
  `s += assistant(gen("x"))`; the state's finished messages go to /v1/chat/completions. A gen
  outside an assistant role, or after text already in its message, has no place in that API: a
  ValueError says so.
- gen on a completion model (`is_chat_model=False`): /v1/completions with the state's text.
- sampling: max_new_tokens -> max_tokens; n, stop, temperature, top_p, frequency/presence penalty
  and seed as they are (n > 1: the variable is the list of the choices' texts); json_schema ->
  `response_format` json_schema on chat models (typed outputs: json_schema=a pydantic model,
  dataclass or TypedDict, as on the native backends). stop_regex and
  spaces_between_special_tokens have no field in the API: a NotSupportedError says so. The rest
  (regex, top_k, min_p, min_tokens, repetition_penalty, ignore_eos, stop_token_ids,
  skip_special_tokens, and json_schema on completion models) are SGLang's extensions, sent in the
  request body: servers like ours take them, others answer 400 and the error names them.
- select: every choice scored by its prompt log-probabilities from /v1/completions (echo,
  logprobs, max_tokens 0), decided by `radixlm.choices` as on the native backends. The prompt is
  the state's text, whose roles are rendered with the server's chat template (published in
  /get_model_info at the base URL's root by our server, else ChatML). OpenAI's own service
  returns no prompt log-probabilities: there select raises a BackendError saying so.
- gen(tools=...) (chat models): `tools` and `tool_choice` passed natively; the first returned
  call becomes the variable (a validated ToolCall), the state's text gets
  `<tool_call>{json}</tool_call>` as on the native backends, and the assistant message carries
  OpenAI `tool_calls`, so a later `s.run_tool(...)` and gen replay the turn as the API expects.
- flush_cache / get_server_info: our native endpoints at the base URL's root when present, else
  False / {}. cache_prefix does nothing (a server with a prefix cache reuses prefixes itself).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx

from radixlm.backend.base import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    UNCONDITIONAL_PREFIX,
    Backend,
    BackendError,
    NotSupportedError,
    chat_messages,
    import_client,
)
from radixlm.choices import ChoiceScores, choice_token_span, decide, requires_unconditional
from radixlm.formats.chat_template import CHATML, ChatTemplate
from radixlm.ir import Gen, SamplingArgs, Select
from radixlm.tools import ToolCall, ToolSet

if TYPE_CHECKING:
    from radixlm.interpreter import StreamExecutor

# SamplingArgs field -> the OpenAI request field that carries it ...
_STANDARD_FIELDS = {
    "max_new_tokens": "max_tokens", "n": "n", "stop": "stop", "temperature": "temperature", "top_p": "top_p",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty", "seed": "seed",
}
# ... or the SGLang extension field, sent in the body (`extra_body`)
_EXTENSION_FIELDS = {
    "min_new_tokens": "min_tokens", "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos", "stop_token_ids": "stop_token_ids", "skip_special_tokens": "skip_special_tokens",
    "regex": "regex", "ebnf": "ebnf",
}
_NO_API_FIELD = ("stop_regex", "spaces_between_special_tokens")  # SamplingArgs fields the API cannot carry
_CALL_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + ".*?" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_PROMPT_LOGPROBS = (
    "select needs the prompt's log-probabilities (/v1/completions with echo=True and logprobs), which "
    "{url} does not return (OpenAI's own API does not); use a server that does (radixlm, SGLang, vLLM)"
)

TokenLogprobs = tuple[list[str], list[float | None]]  # one scored prompt: its tokens' texts and logprobs


class OpenAI(Backend):
    def __init__(
        self,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool | None = None,
        chat_template: ChatTemplate | None = None,
        *,
        model_name: str | None = None,
        **client_kwargs: Any,
    ):
        """`base_url` as the client takes it (e.g. "http://127.0.0.1:30000/v1"; None: the
        client's default, OpenAI's service); `client_kwargs` go to `openai.OpenAI` (timeout,
        max_retries, ...). A local server needs no key: with a base_url and no key given or in
        OPENAI_API_KEY, a placeholder is sent. `model_name` is SGLang's name of `model`."""
        if (model is None) == (model_name is None):
            raise TypeError("OpenAI: pass the model (as `model` or SGLang's `model_name`), once")
        model = model if model is not None else model_name
        self.openai = import_client("openai", "OpenAI", "openai")
        self.model: str = model  # type: ignore[assignment]
        self.is_chat_model = True if is_chat_model is None else bool(is_chat_model)
        if api_key is None and base_url is not None and not os.environ.get("OPENAI_API_KEY"):
            api_key = "EMPTY"
        try:
            self.client = self.openai.OpenAI(base_url=base_url, api_key=api_key, **client_kwargs)
        except self.openai.OpenAIError as e:
            raise BackendError(f"radixlm.OpenAI: {e}") from e
        self.base_url = str(self.client.base_url).rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")  # where our native endpoints live
        self._http = httpx.Client(base_url=self.root_url, headers={"Authorization": f"Bearer {self.client.api_key}"},
                                  timeout=httpx.Timeout(60.0, connect=10.0))
        self._chat_template = chat_template

    def describe(self) -> str:
        return f"the model {self.model!r} at {self.base_url}"

    @property  # type: ignore[override]
    def sends_messages(self) -> bool:
        return self.is_chat_model

    @property  # type: ignore[override]
    def chat_template(self) -> ChatTemplate:
        """The server's role wrappers, fetched once from /get_model_info; ChatML where the server
        publishes none (an unreachable server is asked again next time)."""
        if self._chat_template is None:
            try:
                response = self._http.get("/get_model_info")
            except httpx.TransportError:
                return CHATML  # the request that follows reports the server as unreachable
            published = _json_object(response).get("chat_template") if response.status_code == 200 else None
            self._chat_template = ChatTemplate.from_dict(published) if isinstance(published, dict) else CHATML
        return self._chat_template

    # ------------------------------------------------------------------ gen
    def generate(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[Any, Any]:
        create, request = self._gen_request(s, gen, sampling)
        response = self._create(create, request)
        texts, metas = [], []
        for i, choice in enumerate(sorted(response.choices, key=lambda c: c.index)):
            texts.append((choice.message.content if self.is_chat_model else choice.text) or "")
            meta = _meta(response.id, choice.finish_reason, response.usage if i == 0 else None)  # usage: the total
            if gen.return_logprob:
                meta.update(_output_logprobs(choice.logprobs, self.is_chat_model))
            reasoning = getattr(choice.message, "reasoning_content", None) if self.is_chat_model else None
            if isinstance(reasoning, str):  # a server with a reasoning parser split it off already
                meta["reasoning_content"] = reasoning
            metas.append(meta)
        if (sampling.n or 1) > 1:
            return texts, metas
        return texts[0], metas[0]

    def generate_stream(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> Iterator[tuple[str, dict[str, Any] | None]]:
        create, request = self._gen_request(s, gen, sampling)
        request.update(stream=True, stream_options={"include_usage": True})
        response_id, finish, usage = "", None, None
        with self._api_errors(request), create(**request) as chunks:
            for chunk in chunks:
                response_id, usage = chunk.id or response_id, chunk.usage or usage
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                finish = choice.finish_reason or finish
                piece = (choice.delta.content if self.is_chat_model else choice.text) or ""
                if piece:
                    yield piece, None
        yield "", _meta(response_id, finish, usage)

    def tool_call(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs, tools: ToolSet) -> tuple[str, Any, dict[str, Any]]:
        if not self.is_chat_model:
            raise ValueError("gen(tools=...) needs a chat model: the completions API has no tools")
        mode = tools.choose(gen.tool_choice)  # checks a named tool exists
        create, request = self._gen_request(s, gen, sampling)
        request.update(tools=tools.specs, tool_choice=_api_tool_choice(gen.tool_choice))
        response = self._create(create, request)
        choice = response.choices[0]
        content = choice.message.content or ""
        meta = _meta(response.id, choice.finish_reason, response.usage)
        calls = choice.message.tool_calls or []
        if not calls:
            if not isinstance(mode, str):
                raise BackendError(f"tool_choice {gen.tool_choice!r} forces a tool call, but {self.base_url} answered "
                                   f"without one (finish_reason {choice.finish_reason}): {content[:200]!r}")
            return content, content, meta
        call, block, problem = _read_call(calls[0], tools)
        if call is None:
            if not isinstance(mode, str):
                raise BackendError(f"the tool call from {self.base_url} does not validate: {problem}")
            return content + block, content + block, meta  # as the native backends: an invalid call stays text
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        s.message_extra["tool_calls"] = [{"id": call.id, "type": "function",
                                          "function": {"name": call.name, "arguments": arguments}}]
        return content + block, call, meta

    def _gen_request(self, s: StreamExecutor, gen: Gen, sampling: SamplingArgs) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The client's create function for one gen, and its keyword arguments."""
        values = vars(sampling)
        refused = [f for f in _NO_API_FIELD if values[f] is not None]
        if refused:
            raise NotSupportedError(f"gen({', '.join(refused)}=...) has no field in the OpenAI API; "
                                    "use a native backend (RuntimeEndpoint or an Engine)")
        request: dict[str, Any] = {"model": self.model, "n": 1}
        request.update({api: values[f] for f, api in _STANDARD_FIELDS.items() if values[f] is not None})
        extra = {api: values[f] for f, api in _EXTENSION_FIELDS.items() if values[f] is not None}
        if gen.return_logprob:
            request.update(self._logprob_fields(gen))
        if self.is_chat_model:
            request["messages"] = self._messages(s)
            if sampling.json_schema is not None:
                request["response_format"] = _response_format(sampling.json_schema)
            create = self.client.chat.completions.create
        else:
            request["prompt"] = s.text_
            if sampling.json_schema is not None:
                extra["json_schema"] = sampling.json_schema
            create = self.client.completions.create
        if extra:
            request["extra_body"] = extra
        return create, request

    def _messages(self, s: StreamExecutor) -> list[dict[str, Any]]:
        if s.cur_role != "assistant" or s.text_[s.cur_role_begin :]:
            try:
                chat_messages(s, "chat API")
            except ValueError as e:
                hint = " (for free text completion use OpenAI(..., is_chat_model=False))" if s.cur_role != "assistant" else ""
                raise ValueError(f"{e}{hint}") from None
        return [_api_message(m) for m in s.messages_]

    def _logprob_fields(self, gen: Gen) -> dict[str, Any]:
        if gen.logprob_start_len is not None and gen.logprob_start_len >= 0:
            raise ValueError("gen(logprob_start_len=...): the OpenAI API gives the output's log-probabilities only; "
                             "prompt log-probabilities need the native API (RuntimeEndpoint)")
        top = gen.top_logprobs_num or 0
        if self.is_chat_model:
            return {"logprobs": True, "top_logprobs": top} if top else {"logprobs": True}
        return {"logprobs": top}

    # ------------------------------------------------------------------ select
    def select(self, s: StreamExecutor, sel: Select) -> tuple[int, dict[str, Any]]:
        scored, cached = self._prompt_logprobs([s.text_ + c for c in sel.choices])
        entries = [_choice_entries(texts, logprobs, c) for (texts, logprobs), c in zip(scored, sel.choices)]
        scores = ChoiceScores(
            [[e[0] for e in choice] for choice in entries],
            prompt_tokens=max(len(texts) for texts, _ in scored),
            cached_tokens=cached // len(sel.choices),  # the API reports the total: the mean per choice
            token_entries=entries,  # type: ignore[arg-type]
        )
        if requires_unconditional(sel.choices_method):
            plain, _ = self._prompt_logprobs([UNCONDITIONAL_PREFIX + c for c in sel.choices])
            scores.unconditional_entries = [_choice_entries(t, lp, c) for (t, lp), c in zip(plain, sel.choices)]  # type: ignore[misc]
            scores.unconditional_logprobs = [[e[0] for e in choice] for choice in scores.unconditional_entries]
        return decide(sel.choices, scores, sel.choices_method, sel.temperature)

    def _prompt_logprobs(self, prompts: list[str]) -> tuple[list[TokenLogprobs], int]:
        """Each prompt's tokens and their log-probabilities (one request), and the cached tokens."""
        request: dict[str, Any] = {"model": self.model, "prompt": prompts, "echo": True, "logprobs": 1,
                                   "max_tokens": 0, "temperature": 0}
        try:
            with self._api_errors(request):
                try:
                    response = self.client.completions.create(**request)
                except self.openai.BadRequestError:  # a server that refuses to generate nothing
                    request["max_tokens"] = 1
                    response = self.client.completions.create(**request)
        except BackendError as e:
            raise BackendError(f"{_NO_PROMPT_LOGPROBS.format(url=self.base_url)}: {e}") from e
        scored = []
        for prompt, choice in zip(prompts, sorted(response.choices, key=lambda c: c.index)):
            logprobs = choice.logprobs
            texts = list(getattr(logprobs, "tokens", None) or [])
            values = list(getattr(logprobs, "token_logprobs", None) or [])
            if request["max_tokens"]:  # drop the one generated token
                texts, values = texts[:-1], values[:-1]
            if not (choice.text or "").startswith(prompt) or not values or len(texts) != len(values):
                raise BackendError(_NO_PROMPT_LOGPROBS.format(url=self.base_url))
            scored.append((texts, values))
        return scored, _cached_tokens(response.usage)

    # ------------------------------------------------------------------ server
    def flush_cache(self) -> bool:
        return self._native("POST", "/flush_cache") is not None

    def get_server_info(self) -> dict[str, Any]:
        info = self._native("GET", "/get_server_info")
        return info if isinstance(info, dict) else {}

    def shutdown(self) -> None:
        self.client.close()
        self._http.close()

    def _native(self, method: str, path: str) -> Any:
        """The answer of our native endpoint `path` at the root URL (JSON, or {} if not JSON);
        None where the server has no such endpoint."""
        try:
            response = self._http.request(method, path)
        except httpx.TransportError as e:
            raise BackendError(f"cannot reach the server at {self.root_url}: {e or type(e).__name__}") from e
        return _json_object(response) if response.status_code == 200 else None

    def _create(self, create: Callable[..., Any], request: dict[str, Any]) -> Any:
        with self._api_errors(request):
            return create(**request)

    @contextmanager
    def _api_errors(self, request: dict[str, Any]) -> Iterator[None]:
        """The client's errors as BackendErrors naming the server (and the extensions sent)."""
        try:
            yield
        except self.openai.APIConnectionError as e:
            cause = e.__cause__ or e
            raise BackendError(f"cannot reach the OpenAI-compatible server at {self.base_url}: {cause or type(cause).__name__}") from e
        except self.openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            message = body.get("message") or e.message
            extensions = sorted(request.get("extra_body") or {})
            if extensions and e.status_code in (400, 422):
                message += f" (the request used SGLang extensions, which some servers refuse: {', '.join(extensions)})"
            raise BackendError(f"{self.base_url} answered {e.status_code}: {message}") from e


def _api_message(message: dict[str, Any]) -> dict[str, Any]:
    """A state's message as the chat API takes it: a tool call as `tool_calls` (its text block
    removed from the content), a tool result with its `tool_call_id`."""
    out: dict[str, Any] = {"role": message["role"], "content": message["content"]}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
        out["content"] = _CALL_BLOCK.sub("", message["content"]).strip() or None
    if message["role"] == "tool" and message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _api_tool_choice(tool_choice: Any) -> Any:
    if tool_choice is None or tool_choice in ("auto", "none", "required") or isinstance(tool_choice, dict):
        return tool_choice or "auto"
    return {"type": "function", "function": {"name": tool_choice}}


def _read_call(api_call: Any, tools: ToolSet) -> tuple[ToolCall | None, str, str | None]:
    """(the ToolCall if it parses and validates, its `<tool_call>` text block, the problem)."""
    name, raw = api_call.function.name, api_call.function.arguments or "{}"
    try:
        arguments = json.loads(raw)
    except json.JSONDecodeError:
        arguments = raw
    block = TOOL_CALL_OPEN + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + TOOL_CALL_CLOSE
    if not isinstance(arguments, dict):
        return None, block, f"the arguments of {name!r} are not a JSON object: {raw[:200]!r}"
    call = ToolCall(name, arguments, **({"id": api_call.id} if api_call.id else {}))
    problem = tools.validate(call)
    return (call if problem is None else None), block, problem


def _response_format(json_schema: str) -> dict[str, Any]:
    try:
        schema = json.loads(json_schema)
    except json.JSONDecodeError as e:
        raise ValueError(f"gen(json_schema=...) is not JSON: {e}") from e
    title = schema.get("title") if isinstance(schema, dict) else None
    name = title if isinstance(title, str) and _SCHEMA_NAME.fullmatch(title) else "output"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _choice_entries(texts: list[str], logprobs: list[float | None], choice: str) -> list[list[Any]]:
    """[logprob, None, token_text] of the tokens that spell `choice` (the API gives no token ids)."""
    span = choice_token_span([t or "" for t in texts], choice)
    return [[float(lp), None, t] for t, lp in zip(texts[-span:], logprobs[-span:]) if lp is not None]


def _output_logprobs(logprobs: Any, is_chat: bool) -> dict[str, Any]:
    """The API's output log-probabilities in the native meta shape ([logprob, token id, text];
    the API gives no token ids)."""
    if logprobs is None:
        return {}
    if is_chat:
        content = logprobs.content or []
        return {
            "output_token_logprobs": [[t.logprob, None, t.token] for t in content],
            "output_top_logprobs": [[[x.logprob, None, x.token] for x in t.top_logprobs or []] for t in content],
        }
    tops = logprobs.top_logprobs or [None] * len(logprobs.tokens or [])
    return {
        "output_token_logprobs": [[lp, None, tok] for lp, tok in zip(logprobs.token_logprobs or [], logprobs.tokens or [])],
        "output_top_logprobs": [[[lp, None, tok] for tok, lp in (top or {}).items()] for top in tops],
    }


def _meta(response_id: str, finish_reason: str | None, usage: Any) -> dict[str, Any]:
    """The native meta info of a response; an aborted request (a bad grammar, an abort) raises."""
    if finish_reason == "abort":
        raise BackendError(f"the request {response_id} was aborted by the server")
    meta: dict[str, Any] = {"id": response_id, "finish_reason": {"type": finish_reason} if finish_reason else None}
    if usage is not None:
        meta.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                    cached_tokens=_cached_tokens(usage))
    return meta


def _cached_tokens(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", None) or 0)


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
