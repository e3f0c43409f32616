"""Talk to a running `make serve` with the official openai client: chat, streaming, a JSON-schema
response_format, and a forced tool call.

    python examples/openai_client.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse
import json

import openai


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--api-key", default="none")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key=args.api_key)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    print("chat:", out.choices[0].message.content, "| usage:", out.usage.model_dump())
    print("stream:", end=" ")
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 30}},
              "required": ["capital"], "additionalProperties": False}
    out = client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    print("json:", json.loads(out.choices[0].message.content))
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                       "required": ["city"], "additionalProperties": False}}}]
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools, tool_choice="required", max_tokens=40, temperature=0,
    )
    call = out.choices[0].message.tool_calls[0]
    print("tool call:", call.function.name, json.loads(call.function.arguments))


if __name__ == "__main__":
    main()
