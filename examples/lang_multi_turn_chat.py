"""Multi-turn chat: a system prompt, then user turns, each answered by the assistant in turn.

The roles are the server's chat template (rl.system/user/assistant put its wrappers around each
message); every turn's prompt extends the previous one, so each answer reuses the whole
conversation so far from the radix cache. `s.messages()` gives the conversation as OpenAI-style
messages.

    python examples/lang_multi_turn_chat.py [--url http://127.0.0.1:30000]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    {'role': 'system', 'content': 'You are a friendly travel guide. Answer in one or two short sentences.'}
    {'role': 'user', 'content': 'I am visiting Paris for one day. Name one museum I should see.'}
    {'role': 'assistant', 'content': "I'm delighted to recommend the Musée de la Lumière de Montmartre. It's a
        beautiful example of modern art, showcasing works by artists like Claude Monet and ..."}
    {'role': 'user', 'content': 'What is a famous painting there?'}
    {'role': 'assistant', 'content': 'One of the most famous works of art in the museum is "La Belle Éclat" by
        Claude Monet. It\\'s a beautiful example of Impressionism, ...'}
    {'role': 'user', 'content': 'Thanks! Summarize your advice in one sentence.'}
    {'role': 'assistant', 'content': "I'm glad you enjoyed my advice, and I'm happy to help you plan your trip to Paris."}

(a 135M-parameter model: fluent, and not to be trusted on facts)
"""

from __future__ import annotations

import argparse

import radixlm as rl

TURNS = [
    "I am visiting Paris for one day. Name one museum I should see.",
    "What is a famous painting there?",
    "Thanks! Summarize your advice in one sentence.",
]


@rl.function
def chat(s: rl.ProgramState, turns: list[str]) -> None:
    s += rl.system("You are a friendly travel guide. Answer in one or two short sentences.")
    for i, question in enumerate(turns):
        s += rl.user(question)
        s += rl.assistant(rl.gen(f"answer_{i}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    state = chat.run(turns=TURNS, max_tokens=args.max_tokens, temperature=0)
    for message in state.messages():
        print(message)


if __name__ == "__main__":
    main()
