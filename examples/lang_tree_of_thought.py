"""Tree of thought with fork/join: branch into several ideas, judge them, build on the best.

`s.fork(n)` makes n copies of the conversation so far (its KV is cached first, so the branches
share it instead of recomputing it); each branch samples its own thought (a different seed per
branch); `forks.join()` gathers the branches' variables into the parent, where `s["thought"]`
becomes the list of the n thoughts. The parent then shows them to the model, lets it pick the
most helpful with `select`, and has it build on that one.

    python examples/lang_tree_of_thought.py [--url http://127.0.0.1:30000] [--branches 3] [question]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    question: How can I get better at remembering new words in a foreign language?
    thought 1: Think about this: in a language with multiple words, the first step to better remembering
        could be to practice with a practice of the same material. This can be done by practicing ...
    thought 2: To improve your ability to remember new words in a foreign language, you can try the following:
    thought 3: To improve at remembering new words in a foreign language, one possible idea is to practice
        visual memory, where the key is associating new words with their corresponding images.
    best: 2  (scores: -1.56 -0.82 -1.08)
    answer: Here's a possible way to start:

    To start with this idea, you can begin by practicing with a conversation with a native speaker. This can
    be a great way to get used to the language and make it feel more comfortable.
"""

from __future__ import annotations

import argparse

import radixlm as rl

QUESTION = "How can I get better at remembering new words in a foreign language?"


@rl.function
def tree_of_thought(s: rl.ProgramState, question: str, branches: int) -> None:
    s += rl.system("You are a thoughtful and practical assistant.")
    s += rl.user(f"{question}\nGive one idea, in one sentence.")
    forks = s.fork(branches)
    forks += [rl.assistant(rl.gen("thought", temperature=0.8, seed=i, stop="\n"))
              for i in range(branches)]  # a list: one expression per branch
    forks.join()  # the parent's s["thought"] is now [thought of branch 0, branch 1, ...]

    numbered = "\n".join(f"{i + 1}. {t.strip()}" for i, t in enumerate(s["thought"]))
    s += rl.assistant(f"Here are {branches} ideas:\n{numbered}")
    s += rl.user("Which idea is the most helpful?")
    s += rl.assistant("The most helpful idea is number " + rl.select("best", choices=[str(i + 1) for i in range(branches)]) + ".")
    s += rl.user("Explain in two sentences how to start with that idea.")
    s += rl.assistant(rl.gen("answer", temperature=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--branches", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    # max_tokens here is the default of every gen in the program
    state = tree_of_thought.run(question=args.question, branches=args.branches, max_tokens=args.max_tokens)
    print("question:", args.question)
    for i, thought in enumerate(state["thought"]):
        print(f"thought {i + 1}: {thought.strip()}")
    scores = state.get_meta_info("best")["scores"]
    print(f"best: {state['best']}  (scores: {' '.join(f'{x:.2f}' for x in scores)})")
    print("answer:", state["answer"].strip())


if __name__ == "__main__":
    main()
