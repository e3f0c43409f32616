"""`python -m radixlm.runtime.bench.tensor_parallel`: the model runner at tp 1 and tp N, in one run.

For each tp size: a prefill of `--prefill` tokens (one request), and decode steps at batch 1 and
`--batch` over contexts of `--context` tokens: milliseconds per forward (median of `--repeats`) and
tokens/s; then the all-reduce alone (one decode row and one prefill's rows, shared memory and
gloo; float32) in microseconds. `--shape` picks a random-weight model of a real model's shape whose heads
divide by 2 (qwen2.5-0.5b: 14 query / 2 KV heads, 24 layers; smollm2-1.7b: 32 / 32, 24 layers),
or `--model-path` a model directory. On a 2-core machine, tp 2 gives each rank one core, the
same cores tp 1's two threads use: the bench shows what the split and its all-reduces cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from radixlm.runtime.model.forward_batch import ForwardBatch
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig

SHAPES = {
    "qwen2.5-0.5b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896,
                         intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0),
    "smollm2-1.7b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                         vocab_size=49152, tie_word_embeddings=True, rope_theta=130000.0),
}


def random_model_dir(shape: str, dtype: torch.dtype, root: Path) -> Path:
    """A model directory of `shape` with random weights (speed does not depend on their values)."""
    from safetensors.torch import save_file

    cfg = dict(SHAPES[shape], max_position_embeddings=4096, rms_norm_eps=1e-6, torch_dtype="bfloat16")
    path = root / shape
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    gen = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(dtype)

    state = {"model.embed_tokens.weight": w(cfg["vocab_size"], h), "model.norm.weight": torch.ones(h, dtype=dtype)}
    for layer in range(n):
        p = f"model.layers.{layer}."
        state |= {p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                  p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
                  p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                  p + "mlp.down_proj.weight": w(h, i), p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
                  p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype)}
        if cfg["model_type"] == "qwen2":
            state |= {p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                      p + "self_attn.v_proj.bias": w(kv)}
    save_file(state, str(path / "model.safetensors"))
    return path


def _median_ms(run: object, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def measure(runner: ModelRunner, prefill: int, context: int, batch: int, repeats: int) -> dict[str, float]:
    """ms per forward: a prefill of `prefill` tokens, decode steps of 1 and `batch` requests."""
    pool, rows_pool = runner.kv_pool, runner.req_to_token_pool
    out: dict[str, float] = {}

    def prefill_once() -> None:
        slots = pool.alloc(prefill)
        assert slots is not None
        row = rows_pool.alloc()
        assert row is not None
        rows_pool.write(row, 0, slots)
        runner.forward(ForwardBatch.extend([row], [0], [[7] * prefill], slots))
        pool.free(slots)
        rows_pool.free(row)

    out["prefill"] = _median_ms(prefill_once, repeats)
    rows = [rows_pool.alloc() for _ in range(batch)]
    context_slots = pool.alloc(context)  # every request reads the same context: the pool's size allows it
    assert context_slots is not None and all(r is not None for r in rows)
    for row in rows:
        rows_pool.write(row, 0, context_slots)  # type: ignore[arg-type]
    for size in (1, batch):
        def step(size: int = size) -> None:
            slots = pool.alloc(size)
            assert slots is not None
            for row, slot in zip(rows[:size], slots):
                rows_pool.write(row, context, slot.view(1))  # type: ignore[arg-type]
            runner.forward(ForwardBatch.decode(rows[:size], [context + 1] * size, [7] * size, slots))
            pool.free(slots)

        out[f"decode_b{size}"] = _median_ms(step, repeats)
    pool.free(context_slots)
    for row in rows:
        rows_pool.free(row)  # type: ignore[arg-type]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--model-path", type=Path, help="a model directory instead of --shape")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--quantization", default="none", help="as radixlm serve's (gguf: a converted GGUF's blocks)")
    parser.add_argument("--tp-sizes", default="1,2")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_path or random_model_dir(args.shape, dtype, Path(tmp))
        cfg = ModelConfig.from_dir(model_dir)
        print(f"{model_dir.name}: {cfg.num_layers} layers, {cfg.num_heads} query / {cfg.num_kv_heads} KV heads, "
              f"hidden {cfg.hidden_size}, MLP {cfg.intermediate_size}, {args.dtype}, quantization {args.quantization}, "
              f"{threads} threads in all")
        print(f"{'tp':>3} {'prefill ' + str(args.prefill):>14} {'tok/s':>8} {'decode b1':>10} {'tok/s':>7} "
              f"{'decode b' + str(args.batch):>11} {'tok/s':>7}   all-reduce shm / gloo (us): 1 row, prefill rows")
        for tp in [int(n) for n in args.tp_sizes.split(",")]:
            torch.set_num_threads(threads)
            runner_cfg = RunnerConfig(dtype, "torch", args.prefill + args.context + 2 * args.batch + 64, args.batch + 2,
                                      min(cfg.context_len, 4096), adaptive_threads=False,
                                      quantization=args.quantization,
                                      quant_mode="int8" if args.quantization != "none" else "float32")
            runner = ModelRunner.from_dir(model_dir, runner_cfg, tp)
            try:
                ms = measure(runner, args.prefill, args.context, args.batch, args.repeats)
                reduce = all_reduce_us(runner, cfg.hidden_size, args.prefill) if tp > 1 else ""
            finally:
                runner.close()
            print(f"{tp:>3} {ms['prefill']:>11.1f} ms {args.prefill / ms['prefill'] * 1e3:>8.1f} "
                  f"{ms['decode_b1']:>7.1f} ms {1e3 / ms['decode_b1']:>7.1f} {ms[f'decode_b{args.batch}']:>8.1f} ms "
                  f"{args.batch * 1e3 / ms[f'decode_b{args.batch}']:>7.1f}   {reduce}")


def all_reduce_us(runner: ModelRunner, hidden: int, rows: int) -> str:
    """The all-reduce alone (float32, as DecodeStack's residual stream), on every rank at once:
    rank 0 sends each case as a "time_all_reduce" message that ranks 1..N-1 run too."""
    dtype = torch.float32
    group = runner.tp
    assert group is not None and runner.tp_workers is not None
    parts = []
    for n in (1, rows):
        t = torch.ones(n, hidden, dtype=dtype)
        for shm in (True, False):
            if shm and (group.shm is None or not group.shm.fits(t)):
                parts.append("-")
                continue
            group.broadcast_object(("time_all_reduce", n, hidden, dtype, shm, 200))
            parts.append(f"{group.time_all_reduce(t, shm, 200):.0f}")
    return f"{parts[0]} / {parts[1]}, {parts[2]} / {parts[3]}"


if __name__ == "__main__":
    main()
