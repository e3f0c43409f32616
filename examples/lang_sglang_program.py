"""An SGLang program run by radixlm: `import radixlm as sgl`, then SGLang's names as SGLang's docs
show them. Here: the choice methods as objects (`sgl.greedy_token_selection`, ...) and one of
our own written to SGLang's `ChoicesSamplingMethod` protocol, `gen(n=...)` for several samples,
`gen(stop_regex=...)` to stop at the end of a sentence, the program's return value in
`state.ret_value`, and `sgl.global_config`.

    python examples/lang_sglang_program.py [--url http://127.0.0.1:30000]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    token_length_normalized              -> ' Paris'
    greedy_token_selection               -> ' Paris'
    unconditional_likelihood_normalized  -> ' Paris'
    shortest_plausible                   -> ' Paris'
    3 samples: ['Allez, just', 'The capital of France', 'The capital of France']
    one sentence: 'The capital of France is Paris' (stopped at '.')
    ret_value: {'best': ' Paris', 'samples': 3}
"""

from __future__ import annotations

import argparse
from typing import Any

import radixlm as sgl

CITIES = [" Paris", " Lyon", " Marseille", " Toulouse"]


class ShortestPlausible(sgl.ChoicesSamplingMethod):
    """A choice method of our own: the shortest choice whose mean token log-probability is within
    `margin` of the best one (SGLang's protocol: keyword arguments in, a ChoicesDecision out)."""

    def __init__(self, margin: float = 1.0):
        self.margin = margin

    def __call__(self, *, choices: list[str], normalized_prompt_logprobs: list[float], input_token_logprobs: Any,
                 output_token_logprobs: Any, unconditional_token_logprobs: Any = None) -> sgl.ChoicesDecision:
        best = max(normalized_prompt_logprobs)
        plausible = [c for c, lp in zip(choices, normalized_prompt_logprobs) if lp >= best - self.margin]
        return sgl.ChoicesDecision(min(plausible, key=len), {"plausible": plausible})


METHODS = {
    "token_length_normalized": sgl.token_length_normalized,
    "greedy_token_selection": sgl.greedy_token_selection,
    "unconditional_likelihood_normalized": sgl.unconditional_likelihood_normalized,
    "shortest_plausible": ShortestPlausible(),
}


@sgl.function
def capital(s: Any, method: Any) -> dict[str, Any]:
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant_begin() + "The capital of France is" + sgl.select("city", choices=CITIES, choices_method=method)
    s += sgl.assistant_end()
    s += sgl.user("Say more.")
    s += sgl.assistant(sgl.gen("more", max_tokens=4, n=3, temperature=0.8, seed=1))
    s += sgl.user("Tell me one fact about it in one sentence.")
    s += sgl.assistant(sgl.gen("fact", max_tokens=40, stop_regex=r"[.!?]", temperature=0))
    return {"best": s["city"], "samples": len(s["more"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    args = parser.parse_args()
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    sgl.global_config.verbosity = 0  # 2 prints each program's text after it runs

    for name, method in METHODS.items():
        state = capital.run(method)
        print(f"{name:<36} -> {state['city']!r}")
    print(f"{len(state['more'])} samples: {state['more']}")
    reason = state.get_meta_info("fact")["finish_reason"]
    matched = reason.get("matched")  # the text a stop or stop_regex matched (an int: a stop token)
    stopped = f"stopped at {matched!r}" if isinstance(matched, str) else f"finish: {reason['type']}"
    print(f"one sentence: {state['fact']!r} ({stopped})")
    print(f"ret_value: {state.ret_value}")


if __name__ == "__main__":
    main()
