"""The `radixlm` command.

  radixlm serve [flags]                         the HTTP server (SGLang-native + OpenAI APIs); --help lists flags
  radixlm chat [--model-path P] [--dtype D]     chat with a model in this terminal (in-process engine)
  radixlm generate --prompt TEXT [...]          one completion, printed as JSON
"""

from __future__ import annotations

import argparse
import json
import sys

from radixlm.runtime.config.envs import set_process_defaults

set_process_defaults()  # before torch loads


def _engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", default=None, help="HF model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weight and KV dtype; auto as `radixlm serve --dtype auto` (docs/cpu-support.md)")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size in tokens")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens to generate per reply")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")


def _make_engine(args: argparse.Namespace):  # noqa: ANN202 - Engine import is lazy
    from radixlm.runtime.engine import Engine

    return Engine(model_path=args.model_path, dtype=args.dtype, max_total_tokens=args.max_total_tokens)


def _chat(args: argparse.Namespace) -> int:
    engine = _make_engine(args)
    messages: list[dict[str, str]] = []
    params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    print("radixlm chat: type a message, an empty line or Ctrl-D to quit.", flush=True)
    for line in sys.stdin:
        text = line.strip()
        if not text:
            break
        messages.append({"role": "user", "content": text})
        prompt = engine.tokenizer.apply_chat_template(messages)
        out = engine.generate(prompt=prompt, sampling_params=params)
        assert isinstance(out, dict)
        messages.append({"role": "assistant", "content": out["text"]})
        print(out["text"], flush=True)
    engine.shutdown()
    return 0


def _generate(args: argparse.Namespace) -> int:
    engine = _make_engine(args)
    params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    print(json.dumps(engine.generate(prompt=args.prompt, sampling_params=params), indent=2))
    engine.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from radixlm.runtime.server.serve import main as serve_main

        return serve_main(argv[1:])
    parser = argparse.ArgumentParser(prog="radixlm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="the HTTP server; `radixlm serve --help` lists its flags")
    chat = sub.add_parser("chat", help="interactive chat in the terminal")
    _engine_args(chat)
    gen = sub.add_parser("generate", help="one completion as JSON")
    _engine_args(gen)
    gen.add_argument("--prompt", required=True)
    args = parser.parse_args(argv)
    return _chat(args) if args.command == "chat" else _generate(args)


if __name__ == "__main__":
    sys.exit(main())
