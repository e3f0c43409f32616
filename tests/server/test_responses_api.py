"""OpenAI's Responses API (issue 38, point 2) through the official `openai` client and the OpenAI
Agents SDK, against the real server on 127.0.0.1: the tiny random model (`tiny_server`), whose
outcomes are made model-independent by comparing with /v1/chat/completions on the same prompt,
by grammars (forced tool calls, `text.format`) and by exact token counts; and the scripted
reasoning model (`reasoning_server`), whose output is known."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import httpx
import jsonschema
import openai
import pytest
from conftest import ServerHandle
from pydantic import BaseModel, Field
from radixlm_testing import REASONING_SCRIPT

SMALL_INT = {"type": "integer", "minimum": -999, "maximum": 999}  # bounded: a random model may not stop digits
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": SMALL_INT, "b": SMALL_INT}, "required": ["a", "b"],
       "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "add", "parameters": ADD, "strict": True},
]
PARAMS = {"get_weather": WEATHER, "add": ADD}
FORECAST = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                             "celsius": {"type": "integer", "minimum": -50, "maximum": 50}},
            "required": ["city", "celsius"], "additionalProperties": False}


def test_store_drops_the_least_recently_used() -> None:
    from radixlm.runtime.server.response_store import ResponseStore, StoredResponse

    store = ResponseStore(2)
    for name in ("a", "b"):
        store.put(name, StoredResponse({"id": name}, (), None))
    assert store.get("a") is not None  # now "b" is the least recently used
    store.put("c", StoredResponse({"id": "c"}, (), None))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None and len(store) == 2
    assert store.delete("a") and not store.delete("a") and len(store) == 1
    nothing = ResponseStore(0)
    nothing.put("a", StoredResponse({"id": "a"}, (), None))
    assert nothing.get("a") is None


def client_of(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_text_response_is_the_chat_completion_of_the_same_prompt(tiny_server: ServerHandle,
                                                                  tiny_model_name: str) -> None:
    client = client_of(tiny_server)
    resp = client.responses.create(model=tiny_model_name, instructions="Be brief.", input="Name a colour.",
                                   max_output_tokens=6, temperature=0, metadata={"run": "1"}, user="u1", store=False)
    chat = client.chat.completions.create(model=tiny_model_name, max_tokens=6, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}])
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == tiny_model_name
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output_text == chat.choices[0].message.content
    finished = chat.choices[0].finish_reason
    assert resp.status == ("incomplete" if finished == "length" else "completed")
    if resp.status == "incomplete":
        assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and chat.usage is not None
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.metadata == {"run": "1"} and resp.user == "u1" and resp.instructions == "Be brief."
    assert resp.max_output_tokens == 6 and resp.temperature == 0 and resp.text.format.type == "text"


def test_input_items_are_the_chat_messages_they_stand_for(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    """Messages with text parts, a function call and its output: the prompt is the chat
    completion's of the same conversation (same token count, same greedy text)."""
    client = client_of(tiny_server)
    items: list[Any] = [
        {"role": "developer", "content": "Use the tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                        {"type": "input_text", "text": "Rome?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ]
    resp = client.responses.create(model=tiny_model_name, input=items, tools=TOOLS, tool_choice="none",
                                   max_output_tokens=5, temperature=0, store=False)
    chat = client.chat.completions.create(model=tiny_model_name, max_tokens=5, temperature=0, messages=[
        {"role": "developer", "content": "Use the tools."}, {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])
    assert resp.usage is not None and chat.usage is not None
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.output_text == chat.choices[0].message.content
    assert [t.name for t in resp.tools] == ["get_weather", "add"] and resp.tool_choice == "none"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "add"}])
def test_forced_tool_choice_gives_one_schema_valid_call(tiny_server: ServerHandle, tiny_model_name: str,
                                                        tool_choice: Any) -> None:
    resp = client_of(tiny_server).responses.create(
        model=tiny_model_name, input="Add 2 and 3.", tools=TOOLS, tool_choice=tool_choice, max_output_tokens=48,
        temperature=0, store=False, text={"format": {"type": "json_schema", "name": "ignored", "schema": FORECAST}})
    calls = [item for item in resp.output if item.type == "function_call"]
    assert resp.status == "completed" and len(calls) == 1, resp.output
    call = calls[0]
    assert call.call_id.startswith("call_") and call.id and call.status == "completed"
    assert call.name == ("add" if isinstance(tool_choice, dict) else call.name) and call.name in PARAMS
    jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])


def test_a_stored_call_is_answered_by_its_output(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    """A forced call, stored; the follow-up sends only the call's output with
    previous_response_id: the prompt is the chat completion's of the whole conversation."""
    client = client_of(tiny_server)
    first = client.responses.create(model=tiny_model_name, input="Weather in Rome?", tools=TOOLS, max_output_tokens=32,
                                    tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    call = first.output[0]
    assert call.type == "function_call"
    follow = client.responses.create(model=tiny_model_name, previous_response_id=first.id, tools=TOOLS,
                                     tool_choice="none", max_output_tokens=2, temperature=0,
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    chat = client.chat.completions.create(model=tiny_model_name, max_tokens=1, messages=[
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}])
    assert follow.usage is not None and chat.usage is not None
    assert follow.usage.input_tokens == chat.usage.prompt_tokens


def test_text_format_json_schema_and_parse(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    class Forecast(BaseModel):
        city: Literal["Paris", "Rome"]
        celsius: Annotated[int, Field(ge=-50, le=50)]

    client = client_of(tiny_server)
    parsed = client.responses.parse(model=tiny_model_name, input="Forecast for Paris?", text_format=Forecast,
                                    max_output_tokens=40, temperature=0, store=False)
    assert isinstance(parsed.output_parsed, Forecast)
    resp = client.responses.create(model=tiny_model_name, input="Forecast?", max_output_tokens=40, store=False,
                                   text={"format": {"type": "json_schema", "name": "forecast", "schema": FORECAST,
                                                    "strict": True}})
    jsonschema.validate(json.loads(resp.output_text), FORECAST)
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "forecast"
    as_object = client.responses.create(model=tiny_model_name, input="JSON please", max_output_tokens=40,
                                        store=False, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(as_object.output_text), dict)


def test_stream_events_accumulate_to_the_response(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    """A streamed text (a bounded JSON format, so it completes): the typed events in order,
    numbered, their deltas the text of the final response and of the same request unstreamed.
    Cut off by max_output_tokens, the stream ends with response.incomplete."""
    client = client_of(tiny_server)
    request: dict[str, Any] = dict(model=tiny_model_name, input="Forecast?", max_output_tokens=40, temperature=0,
                                   store=False, text={"format": {"type": "json_schema", "name": "f", "schema": FORECAST}})
    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == client.responses.create(**request).output_text
    jsonschema.validate(json.loads(final.output_text), FORECAST)
    assert final.usage is not None and final.usage.output_tokens > 0 and final.status == "completed"
    with client.responses.stream(**{**request, "text": None, "max_output_tokens": 2}) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.output[0].status == "incomplete"


def test_stream_function_call_events(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    with client_of(tiny_server).responses.stream(
            model=tiny_model_name, input="Weather?", tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=32, temperature=0, store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call = next(item for item in final.output if item.type == "function_call")
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(e.delta for e in deltas) == done[0].arguments == call.arguments
    assert {e.item_id for e in deltas + done} == {call.id}
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert events[-1].type == "response.completed"
    # streamed as generated: the call's item (with its name) opens first, then the arguments, a
    # fragment per delta that brought some of them (OutputChunk.new_pieces: however many deltas
    # waited for the server's loop), so the forced opening `{"city": "` and the tokens after it
    # come apart whatever the machine's load
    assert len(deltas) >= 2
    added = next(i for i, e in enumerate(events) if e.type == "response.output_item.added" and e.item.id == call.id)
    assert events[added].item.name == "get_weather" and events[added].item.arguments == ""
    assert added < events.index(deltas[0])
    whole = client_of(tiny_server).responses.create(
        model=tiny_model_name, input="Weather?", tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=32, temperature=0, store=False)
    assert [(i.name, i.arguments) for i in whole.output if i.type == "function_call"] == [(call.name, call.arguments)]


def test_store_retrieve_delete(tiny_server: ServerHandle, tiny_model_name: str) -> None:
    client = client_of(tiny_server)
    resp = client.responses.create(model=tiny_model_name, input="Hi", max_output_tokens=3, temperature=0)
    assert resp.store is True
    again = client.responses.retrieve(resp.id)
    assert again.model_dump() == resp.model_dump()
    deleted = client.responses.delete(resp.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    for call in (lambda: client.responses.retrieve(resp.id), lambda: client.responses.delete(resp.id)):
        with pytest.raises(openai.NotFoundError, match="no stored response has this id"):
            call()
    unstored = client.responses.create(model=tiny_model_name, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        client.responses.create(model=tiny_model_name, input="Hi", previous_response_id=unstored.id)


@pytest.mark.parametrize("server_name", ["tiny_server", "reasoning_server"])
def test_previous_response_id_continues_on_the_cached_turn(server_name: str, request: pytest.FixtureRequest) -> None:
    """The follow-up's prompt begins with the previous turn's exact prompt and output tokens, so
    the radix cache serves all of them but the last output token (which never went through
    the model): that many cached tokens, exactly, at least. The tiny model stops at
    max_output_tokens, the scripted one with EOS; a third turn chains on the second."""
    server: ServerHandle = request.getfixturevalue(server_name)
    client = client_of(server)
    model = client.models.list().data[0].id
    first = client.responses.create(model=model, input="Tell me a story about a red fox in the snow.",
                                    max_output_tokens=6, temperature=0)
    turns = [first]
    for text in ("And then?", "How did it end?"):
        turns.append(client.responses.create(model=model, input=text, previous_response_id=turns[-1].id,
                                             max_output_tokens=6, temperature=0))
    for before, after in zip(turns, turns[1:]):
        assert before.usage is not None and after.usage is not None
        covered = before.usage.input_tokens + before.usage.output_tokens - 1
        assert after.usage.input_tokens_details.cached_tokens >= covered, (before.usage, after.usage)
        assert after.usage.input_tokens > covered + 2  # the new turn is there, and was not cached
        assert after.previous_response_id == before.id
    # the conversation is the one a client would send whole: same prompt length
    chat_messages: list[Any] = [{"role": "user", "content": "Tell me a story about a red fox in the snow."}]
    chat_messages += [{"role": "assistant", "content": _raw_text(server, turns[0])}, {"role": "user", "content": "And then?"}]
    chat = client.chat.completions.create(model=model, messages=chat_messages, max_tokens=1)
    assert chat.usage is not None and turns[1].usage is not None
    assert abs(chat.usage.prompt_tokens - turns[1].usage.input_tokens) <= 1  # a BPE merge at the turn's seam at most


def _raw_text(server: ServerHandle, resp: Any) -> str:
    """What the model wrote in `resp`: its reasoning (scripted server) and its text."""
    texts = [part.text for item in resp.output if item.type == "reasoning" for part in (item.content or [])]
    if texts:
        return texts[0] + "</think>" + resp.output_text
    return str(resp.output_text)


def test_reasoning_is_a_reasoning_item(reasoning_server: ServerHandle) -> None:
    client = client_of(reasoning_server)
    model = client.models.list().data[0].id
    resp = client.responses.create(model=model, input="What is 2 + 2?", store=False)
    reasoning, answer = REASONING_SCRIPT[0], REASONING_SCRIPT[2]
    assert [item.type for item in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content is not None and resp.output[0].content[0].text == reasoning
    assert resp.output_text == answer and resp.status == "completed"
    assert resp.usage is not None and resp.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model=model, input="What is 2 + 2?", store=False) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == answer
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == answer


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"input": [{"type": "web_search_call", "id": "x"}]}, 400, "input[0].type 'web_search_call' is not supported"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, 400,
     "input[0].content"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, 400, "input[0].call_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type 'web_search' is not supported"),
    ({"input": "hi", "tools": [{"type": "function", "name": "has space"}]}, 400, "tools[0].name"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": TOOLS}, 400, "nope"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}}, 400, "text.format.json_schema.name"),
    ({"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata holds at most 16"),
    ({"input": "hi", "truncation": "auto"}, 400, "truncation"),
    ({"input": "hi", "background": True}, 400, "background"),
    ({"input": []}, 400, "input must hold at least one item"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, 404, "previous_response_id 'resp_unknown'"),
    ({"input": "hi", "model": "gpt-4o"}, 404, "not served here"),
])  # fmt: skip
def test_bad_requests_are_refused_naming_the_field(tiny_server: ServerHandle, body: dict[str, Any], status: int,
                                                   message: str) -> None:
    resp = httpx.post(tiny_server.url + "/v1/responses", json=body, timeout=60)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert message in error["message"] and error["code"] == status


# --- the OpenAI Agents SDK ----------------------------------------------------------------------


class Forecast(BaseModel):
    city: Literal["Paris", "Rome"]
    celsius: Annotated[int, Field(ge=-50, le=50)]


@pytest.mark.parametrize(("model_class", "is_streamed"), [
    ("OpenAIResponsesModel", False), ("OpenAIChatCompletionsModel", False), ("OpenAIResponsesModel", True)])
def test_agents_sdk_runs_tools_then_a_structured_final_output(tiny_server: ServerHandle, tiny_model_name: str,
                                                              model_class: str, is_streamed: bool) -> None:
    """An agent with two function tools and a pydantic final output, on the random model: the
    first turn is forced to call a tool (tool_choice required; the SDK then resets it to auto),
    the tool runs with arguments its schema accepts, and the final output parses. Also
    streamed (`Runner.run_streamed`, the Responses API's events)."""
    import agents

    agents.set_tracing_disabled(True)  # no network
    calls: list[tuple[str, dict[str, Any]]] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather in a city."""
        calls.append(("get_weather", {"city": city}))
        return "sunny, 21 C"

    @agents.function_tool
    def add(a: Annotated[int, Field(ge=-999, le=999)], b: Annotated[int, Field(ge=-999, le=999)]) -> int:
        """Add two numbers."""
        calls.append(("add", {"a": a, "b": b}))
        return a + b

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=tiny_server.url + "/v1", api_key="none", max_retries=0)
        model = getattr(agents, model_class)(model=tiny_model_name, openai_client=client)
        agent = agents.Agent(name="forecaster", instructions="Find the weather, then answer.", tools=[get_weather, add],
                             output_type=Forecast, model=model,
                             model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=48))
        try:
            if not is_streamed:
                return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)
            streamed = agents.Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
            assert [event async for event in streamed.stream_events()]
            return streamed
        finally:
            await client.close()

    result = asyncio.run(run())
    assert isinstance(result.final_output, Forecast)
    assert calls and all(name in ("get_weather", "add") for name, _ in calls)
    for name, arguments in calls:
        jsonschema.validate(arguments, WEATHER if name == "get_weather" else ADD)
    kinds = [item.type for item in result.new_items]
    assert kinds[0] == "tool_call_item" and "tool_call_output_item" in kinds and kinds[-1] == "message_output_item"
