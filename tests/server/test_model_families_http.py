"""Greedy outputs of every new dense family and one mixture of experts (radixlm_testing.FAMILY_CONFIGS,
tiny, random weights, the default model's tokenizer) through the real server equal transformers'
`generate` (the other MoE families differ from Qwen3-MoE only below the Engine, which
tests/runtime/test_model_families.py covers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import running_server
from radixlm_testing import FAMILY_CONFIGS, MOE_FAMILIES

PROMPTS = [[200, 13, 13, 7], [5, 9, 2, 77, 31, 8, 100, 4, 61, 3] * 3]  # see tests/runtime/test_model_families.py
STEPS = 20


SERVED = sorted(k for k in FAMILY_CONFIGS if k not in MOE_FAMILIES or k == "qwen3_moe")


@pytest.mark.parametrize("kind", SERVED)
def test_server_greedy_matches_hf_generate(kind: str, family_models: dict[str, tuple[Any, Path]],
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    hf, path = family_models[kind]
    with running_server(path, tmp_path_factory, f"server-{kind}", "--dtype", "float32",
                        "--max-total-tokens", "2048") as server:
        resp = httpx.post(server.url + "/generate", timeout=120, json={
            "input_ids": PROMPTS,
            "sampling_params": {"temperature": 0, "max_new_tokens": STEPS, "ignore_eos": True}})
    assert resp.status_code == 200, resp.text
    for prompt, res in zip(PROMPTS, resp.json()):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(prompt):].tolist()
        assert res["output_ids"] == want
