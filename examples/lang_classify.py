"""Classification with `select`: the model scores every label after the prompt, and the most
likely one (mean log-probability per token, SGLang's token_length_normalized) is the answer.

Each label's log-probabilities come from one batched request that reuses the prompt's cached KV;
`run_batch` classifies all the texts concurrently (the instructions and the two example turns,
common to all, are computed once). `get_meta_info("topic")["scores"]` holds the
per-label scores the choice was made from.

    python examples/lang_classify.py [--url http://127.0.0.1:30000] [text ...]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    sports     | The striker scored twice in the final minutes and the team won the championship.
               | scores: sports=-0.53 politics=-5.51 technology=-8.34 food=-9.14 weather=-5.50
    politics   | Parliament passed the new budget after a long debate between the two main parties.
               | scores: sports=-9.88 politics=-0.62 technology=-9.93 food=-12.26 weather=-10.02
    technology | The new phone has a faster chip, a better camera and a bigger battery.
               | scores: sports=-7.35 politics=-9.54 technology=-0.22 food=-5.75 weather=-7.73
    food       | Simmer the tomatoes with garlic and olive oil, then stir in fresh basil.
               | scores: sports=-8.28 politics=-7.13 technology=-7.27 food=-0.92 weather=-4.81
    weather    | Heavy rain and strong winds are expected tomorrow, with snow in the mountains.
               | scores: sports=-5.41 politics=-6.05 technology=-7.14 food=-10.84 weather=-0.13

(without the two example turns this model calls the weather report "sports")
"""

from __future__ import annotations

import argparse

import radixlm as rl

LABELS = ["sports", "politics", "technology", "food", "weather"]
TEXTS = [
    "The striker scored twice in the final minutes and the team won the championship.",
    "Parliament passed the new budget after a long debate between the two main parties.",
    "The new phone has a faster chip, a better camera and a bigger battery.",
    "Simmer the tomatoes with garlic and olive oil, then stir in fresh basil.",
    "Heavy rain and strong winds are expected tomorrow, with snow in the mountains.",
]


SHOTS = [  # two answered turns first: a small model follows the format much better
    ("The election results will be announced tonight.", "politics"),
    ("Expect sunshine and a light breeze this afternoon.", "weather"),
]


@rl.function
def classify(s: rl.ProgramState, text: str) -> None:
    s += rl.system(f"Classify the topic of the user's text as one of: {', '.join(LABELS)}.")
    for shot, label in SHOTS:
        s += rl.user(shot)
        s += rl.assistant(f"Topic: {label}")
    s += rl.user(text)
    s += rl.assistant("Topic: " + rl.select("topic", choices=LABELS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="*", default=TEXTS)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    states = classify.run_batch([{"text": t} for t in args.texts])
    for text, state in zip(args.texts, states):
        scores = state.get_meta_info("topic")["scores"]
        shown = " ".join(f"{label}={score:.2f}" for label, score in zip(LABELS, scores))
        print(f"{state['topic']:<10} | {text}")
        print(f"{'':<10} | scores: {shown}")


if __name__ == "__main__":
    main()
