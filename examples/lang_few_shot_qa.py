"""Few-shot question answering: a few Q/A pairs, then the question, then `gen` up to the newline.

All the questions share the few-shot prefix, so `run_batch` has it computed once and every item
reuses it from the radix cache (see "cached" below).

    python examples/lang_few_shot_qa.py [--url http://127.0.0.1:30000] [question ...]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    What is the capital of Italy?
      -> 'Rome'  (86 prompt tokens, 77 cached)
    What do bees make?
      -> 'Honey'  (84 prompt tokens, 77 cached)
    What is the largest planet in the solar system?
      -> 'Jupiter'  (89 prompt tokens, 79 cached)
    What is frozen water called?
      -> 'Ice'  (85 prompt tokens, 78 cached)
"""

from __future__ import annotations

import argparse

import radixlm as rl

SHOTS = [
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "Eight"),
    ("What color is the sky on a clear day?", "Blue"),
    ("Who wrote Romeo and Juliet?", "William Shakespeare"),
]
QUESTIONS = [
    "What is the capital of Italy?",
    "What do bees make?",
    "What is the largest planet in the solar system?",
    "What is frozen water called?",
]


@rl.function
def few_shot_qa(s: rl.ProgramState, question: str) -> None:
    s += "Answer each question in a few words.\n\n"
    for q, a in SHOTS:
        s += f"Q: {q}\nA: {a}\n\n"
    s += f"Q: {question}\nA:" + rl.gen("answer", stop="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="*", default=QUESTIONS)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    # keyword arguments named like gen's are defaults for every gen of the program
    states = few_shot_qa.run_batch([{"question": q} for q in args.questions], max_tokens=args.max_tokens, temperature=0)
    for question, state in zip(args.questions, states):
        meta = state.get_meta_info("answer")
        print(question)
        print(f"  -> {state['answer'].strip()!r}  ({meta['prompt_tokens']} prompt tokens, {meta['cached_tokens']} cached)")


if __name__ == "__main__":
    main()
