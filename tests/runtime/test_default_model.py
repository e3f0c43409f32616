"""End to end on the real default model (SmolLM2-135M-Instruct): our engine's greedy chat output
equals transformers' greedy output on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.model_files import float_checkpoint_dir

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
]
NEW_TOKENS = 48

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(default_model_dir: Path) -> Engine:
    eng = Engine(None, dtype="float32", max_total_tokens=8192)
    yield eng
    eng.shutdown()


def hf_greedy(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(float_checkpoint_dir(model_dir), dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.eos_token_id)
            outs.append(gen[0, ids.shape[1] :].tolist())
    return outs


def test_greedy_chat_matches_transformers(engine: Engine, default_model_dir: Path) -> None:
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": c}]) for c in CHATS]
    ours = engine.generate(prompt=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
    want = hf_greedy(default_model_dir, prompts)
    for got, ref in zip(ours, want):
        # transformers keeps the EOS token in its output; so do we (output_ids), text drops it
        assert got["output_ids"] == ref
    assert "Paris" in ours[0]["text"]


def test_default_model_loads_from_cache_by_default(engine: Engine) -> None:
    info = engine.get_server_info()
    assert info["model_path"].startswith("default:")
    assert engine.model_config.architecture == "LlamaForCausalLM" and engine.model_config.num_layers == 30
