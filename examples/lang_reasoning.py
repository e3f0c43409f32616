"""Reasoning separation: a reasoning model thinks first (`<think>` ... `</think>`), then answers.
With a server started with `--reasoning-parser` (SGLang's names: deepseek-r1, qwen3, ...), the
reasoning and the answer come apart three ways: the language's `separate_reasoning` (the variable
holds the answer, `{name}_reasoning_content` the reasoning), the OpenAI chat API
(`message.reasoning_content`), and POST /separate_reasoning for any text. A grammar applies to the
answer only: the model reasons freely, and the regex starts after `</think>`.

    make serve ARGS="--model-path A_REASONING_MODEL --reasoning-parser deepseek-r1"
    python examples/lang_reasoning.py [--url http://127.0.0.1:30000] [--parser deepseek-r1]

Sample output (the suite's scripted tiny model, which reasons "Adding two numbers" and answers
"The answer is 4"; under the regex it writes its fallback digit 7; SmolLM2, the default model,
does not reason, so with deepseek-r1 all its output would count as reasoning):

    reasoning: 'Adding two numbers'
    answer:    'The answer is 4'
    number:    '7'  (regex [0-9]+, after reasoning 'Adding two numbers')
    chat:      reasoning_content='Adding two numbers' content='The answer is 4'
    /separate_reasoning: {'text': 'The answer is 4', 'reasoning_text': 'Adding two numbers'}
"""

from __future__ import annotations

import argparse

import httpx

import radixlm as rl


@rl.function
def solve(s: rl.ProgramState, question: str, parser: str) -> None:
    s += rl.user(question)
    s += rl.assistant(rl.separate_reasoning(rl.gen("answer", max_tokens=256, temperature=0), model_type=parser))
    s += rl.user("Only the number, please.")
    # the regex constrains the answer; the reasoning before it is free (require_reasoning)
    s += rl.assistant(rl.separate_reasoning(rl.gen("number", max_tokens=256, regex="[0-9]+", temperature=0),
                                            model_type=parser))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--parser", default="deepseek-r1", help="the server's --reasoning-parser")
    args = parser.parse_args()

    state = solve.run("What is two plus two?", args.parser, backend=rl.RuntimeEndpoint(args.url))
    print(f"reasoning: {state['answer_reasoning_content']!r}")
    print(f"answer:    {state['answer']!r}")
    print(f"number:    {state['number']!r}  (regex [0-9]+, after reasoning {state['number_reasoning_content']!r})")

    chat = httpx.post(f"{args.url}/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": "What is two plus two?"}], "max_tokens": 256, "temperature": 0})
    chat.raise_for_status()
    message = chat.json()["choices"][0]["message"]
    print(f"chat:      reasoning_content={message.get('reasoning_content')!r} content={message['content']!r}")

    split = httpx.post(f"{args.url}/separate_reasoning", timeout=60,
                       json={"text": "Adding two numbers</think>The answer is 4", "reasoning_parser": args.parser})
    split.raise_for_status()
    print(f"/separate_reasoning: {split.json()}")


if __name__ == "__main__":
    main()
