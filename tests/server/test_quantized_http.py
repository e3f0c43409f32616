"""Quantized modes end to end through the real server, on every CPU (the kernels run at every ISA
level): the default model from its own Q4_1 blocks (`--quantization gguf`, what `auto` keeps),
and a float checkpoint quantized at load (w8a8_int8 where the CPU multiplies int8 in hardware,
else q4_0 weight-only), through the native and OpenAI APIs; a bad value is refused at start."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from conftest import start_server

from radixlm.runtime.model.kernel_policy import cpu_isa


def int8_dot_is_fast() -> bool:
    chosen = cpu_isa()
    assert chosen is not None, "the CPU probe builds on every test machine"
    return chosen.int8_dot_is_fast


def test_default_model_serves_from_its_q4_1_blocks(default_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(None, tmp_path / "q4_1.log", "--quantization", "gguf", "--max-total-tokens", "4096",
                          "--log-level", "info")
    try:
        info = httpx.get(server.url + "/get_server_info").json()
        assert info["quantization"] == "gguf"
        mode = "int8" if int8_dot_is_fast() else "float32"
        assert f"121 quantized linear layers ({mode})" in server.log()  # 30 x (qkv, o, gate_up, down) + lm_head
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": "Name a big city in France."}],
        )
        assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
        out = httpx.post(server.url + "/generate", json={"text": "The capital of France is",
                                                          "sampling_params": {"temperature": 0, "max_new_tokens": 4}}).json()
        assert "Paris" in out["text"]
    finally:
        server.stop()


def test_a_float_model_quantized_at_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    """w8a8_int8 where the CPU has VNNI; q4_0 weight-only elsewhere (the weight-only mode's exactness
    is checked in tests/runtime/test_quantized.py on every machine)."""
    vnni = int8_dot_is_fast()
    flags = ["--quantization", "w8a8_int8"] if vnni else ["--quantization", "q4_0", "--quantized-activations", "float32"]
    server = start_server(tiny_model_dir, tmp_path / "quant.log", *flags, "--max-total-tokens", "2048",
                          "--log-level", "info")
    try:
        mode = "int8_row" if vnni else "float32"
        assert f"8 quantized linear layers ({mode})" in server.log()  # 2 layers x qkv, o, gate_up, down
        body = {"text": "Hello there", "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}
        out = httpx.post(server.url + "/generate", json=body).json()
        assert out["meta_info"]["completion_tokens"] == 8
        streamed = httpx.post(server.url + "/generate", json={**body, "stream": True}).text
        assert streamed.rstrip().endswith("data: [DONE]")
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        done = client.completions.create(model=client.models.list().data[0].id, prompt="Hello there", max_tokens=8,
                                         temperature=0)
        assert done.choices[0].text == out["text"]  # same greedy tokens through both APIs
    finally:
        server.stop()


def test_an_unknown_quantization_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="invalid choice: 'q5_k'"):
        start_server(None, tmp_path / "bad.log", "--quantization", "q5_k")
