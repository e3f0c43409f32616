"""Program traces: `run_batch(..., trace=True)` records every model call each program made (what
was sent, what came back, prompt / cached / completion tokens, latency), forks included;
`state.trace()` returns them and `radixlm.write_traces` writes them as JSON lines, one call per
line, ready for a dashboard or `jq`.

    python examples/lang_traces.py [--url http://127.0.0.1:30000] [--out traces.jsonl]

Sample output (SmolLM2-135M-Instruct, `make serve`; latencies vary):

    run 1 (Oslo): 4 calls, 185 prompt tokens (148 cached), 28 completion tokens
      select  season    branch -  'autumn'  cached 27/31  353 ms
      gen     idea      branch 1  'May 2018.'  cached 52/53  624 ms
      gen     idea      branch 0  'It would be great to visit Oslo in the spring, but'  cached 33/53  804 ms
      gen     dish      branch -  'bjeljek, a traditional'  cached 36/48  424 ms
    ...
    run 3 (Kyoto): 4 calls, 185 prompt tokens (148 cached), 32 completion tokens
      select  season    branch -  'autumn'  cached 27/31  394 ms
      gen     idea      branch 0  'Take a stroll through the Fushimi Ichiran'  cached 33/53  798 ms
      gen     idea      branch 1  "October is the perfect time to explore Kyoto's vibrant autumn foliage"  cached 52/53  867 ms
      gen     dish      branch -  "Kyoto's culinary scene is renowned"  cached 36/48  367 ms
    wrote 12 calls to traces.jsonl

One line of traces.jsonl (shortened):

    {"program": "plan", "run_id": "31a3...", "branch": "", "index": 0, "primitive": "select",
     "name": "season", "sent": {"prompt": "<|im_start|>system\\nYou plan short trips.<|im_end|>...",
     "choices": ["spring", "summer", "autumn", "winter"], "choices_method": "token_length_normalized",
     "temperature": 0.0}, "received": {"choice": "autumn"}, "prompt_tokens": 31, "cached_tokens": 27,
     "completion_tokens": null, "latency_s": 0.353, "started_at": 1795604243.25, "error": null}
"""

from __future__ import annotations

import argparse

import radixlm as rl

CITIES = ["Oslo", "Lima", "Kyoto"]


@rl.function
def plan(s: rl.ProgramState, city: str) -> str:
    s += rl.system("You plan short trips.")
    s += rl.user(f"Which season is best for a trip to {city}?")
    s += rl.assistant(rl.select("season", choices=["spring", "summer", "autumn", "winter"]))
    forks = s.fork(2)  # two ideas in parallel, on the cached conversation
    forks += rl.user("One idea for a day there, in one sentence.")
    forks += rl.assistant(rl.gen("idea", max_tokens=12, stop="\n", temperature=0.7))
    forks.join()
    s += rl.user("Name one dish to try.")
    s += rl.assistant(rl.gen("dish", max_tokens=8, stop="\n", temperature=0))
    return f"{city} in {s['season']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--out", default="traces.jsonl")
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    states = plan.run_batch([{"city": c} for c in CITIES], trace=True)
    for i, (city, state) in enumerate(zip(CITIES, states), 1):
        trace = state.trace()
        totals = trace.totals()
        print(f"run {i} ({city}): {totals['calls']} calls, {totals['prompt_tokens']} prompt tokens "
              f"({totals['cached_tokens']} cached), {totals['completion_tokens']} completion tokens")
        for entry in trace:
            got = entry.received.get("choice", entry.received.get("text"))
            print(f"  {entry.primitive:<7} {entry.name:<9} branch {entry.branch or '-'}  {got!r}  "
                  f"cached {entry.cached_tokens}/{entry.prompt_tokens}  {entry.latency_s * 1000:.0f} ms")
    written = rl.write_traces(states, args.out, append=False)
    print(f"wrote {written} calls to {args.out}")


if __name__ == "__main__":
    main()
