"""The in-process engine: a batch sharing a prefix, streaming, and a JSON-schema constrained answer.

    python examples/offline_engine.py [--model-path DIR_OR_GGUF]     (default: the embedded model)
"""

from __future__ import annotations

import argparse
import json

from radixlm.runtime import Engine

SYSTEM = "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"


def chat(question: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    with Engine(args.model_path, max_total_tokens=8192) as engine:
        greedy = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        questions = ["What is the capital of France?", "Name a primary color.", "What is 2 + 2?"]
        for q, out in zip(questions, engine.generate(prompt=[chat(q) for q in questions], sampling_params=greedy)):
            meta = out["meta_info"]
            print(f"{q} -> {out['text']!r} (cached prompt tokens: {meta['cached_tokens']}/{meta['prompt_tokens']})")
        print("streamed:", end=" ")
        shown = ""
        for chunk in engine.generate(prompt=chat("Count to five."), sampling_params=greedy, stream=True):
            print(chunk["text"][len(shown):], end="", flush=True)
            shown = chunk["text"]
        print()
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                   "country": {"type": "string", "maxLength": 20}},
                  "required": ["city", "country"], "additionalProperties": False}
        out = engine.generate(prompt=chat("Give a city and its country as JSON."),
                              sampling_params={"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(schema)})
        print("constrained:", json.loads(out["text"]))
        print("server info:", {k: engine.get_server_info()[k] for k in ("kv_pool", "radix_cache")})


if __name__ == "__main__":
    main()
