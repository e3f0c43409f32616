"""Running the model: a prepared `ForwardBatch` in, logits out.

`model_runner` owns the weights and the KV pool and executes one forward; `forward_batch` is the
batch's tensors; `models/` our Llama-family code (Llama, Mistral, Qwen2, Qwen3); `attention/`
the backends (torch, triton) over the paged KV layout of `mem_cache`; `model_config`,
`model_files` and `gguf_convert` load configs and weights (HF directories, GGUF files, the
embedded default model). No scheduling logic here.
"""
