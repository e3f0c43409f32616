"""llama.cpp as a benchmark peer: W1-W5 through llama-cpp-python's C API (`llama_cpp`).

What it measures: the workloads of `python -m radixlm.runtime.bench` (prompts from
radixlm.runtime.bench.workloads, greedy, the same token counts, EOS ignored where the workload
ignores it), timed by the bench's own `run_system`, so each figure means what it means for
radixlm and transformers:
  W1  one sequence: the prompt in one llama_decode, then one llama_decode per new token
  W2  the 32 prompts in waves of `batch` sequences, each its own KV stream: a wave's prompts are
      prefilled together (one llama_batch, a seq id per token, llama_decode calls of up to
      N_BATCH tokens), then one llama_decode per step over every sequence of the wave
  W3  the same, but the prompts' common prefix (the 976-token directory) is prefilled once into
      sequence 0 and copied to every other sequence with llama_memory_seq_cp; the waves then
      prefill only the questions
  W4  each passage alone, through llama.cpp's grammar sampler on a GBNF grammar made from W4's
      JSON schema by llama-cpp-python (json_schema_to_gbnf); greedy; stops at end of generation
  W6  the same with W6's schema; and in mode "json_schema, lookup" with prompt-lookup decoding as
      llama.cpp's lookup example and llama-cpp-python's LlamaPromptLookupDecoding do it: a draft
      of up to LOOKUP_DRAFT tokens that followed the latest earlier occurrence of the last
      LOOKUP_NGRAM (or fewer) tokens, verified in one llama_decode with a logits row per draft
      token, kept while the grammar-constrained argmax agrees, the rest removed from the KV cache
  W5  the 2,000-token prompt in one llama_decode (n_ubatch tokens per physical step)
Greedy is the argmax of each output row (W4: the argmax if the grammar accepts it, else the
argmax over the grammar-masked row, as llama.cpp's own samplers do).
Weights: the default model's own GGUF (Q4_1 blocks, a Q8_0 token embedding: the file radixlm
converts) for q4_1, and f32 / f16 / bf16 / q8_0 GGUFs re-encoded from it once by llama.cpp's own
quantizer (llama_model_quantize, allow_requantize) into <cache>/peers/.
Configurations (PeerConfig): dtype x batch x flash attention x n_ubatch. A workload runs only on
the configurations that differ in the knobs it depends on (WORKLOAD_KNOBS); the summary table
gives each workload's best configuration. Needs `make bench-peers`.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from radixlm.runtime.bench.results import ResultTables, comparison_row, table_rows

Result = dict[str, float]
DTYPE_TO_FTYPE = {"f32": 0, "f16": 1, "q4_1": 3, "q8_0": 7, "bf16": 32}  # llama.cpp's llama_ftype
SOURCE_DTYPE = "q4_1"  # the default model's own GGUF: used as it is
FULL_SWEEP: dict[str, tuple[Any, ...]] = {
    "dtype": ("bf16", "q8_0", "q4_1"), "batch": (16, 32), "flash_attn": (True, False), "n_ubatch": (512, 2048),
}
QUICK_CONFIGS = "bf16:32:on:512,q8_0:32:on:512,q4_1:32:on:512"
# the knobs each workload's figures depend on (batch only matters with many prompts, n_ubatch
# only with long prefills)
WORKLOAD_KNOBS: dict[str, tuple[str, ...]] = {
    "W1": ("dtype", "flash_attn"),
    "W2": ("dtype", "batch", "flash_attn", "n_ubatch"),
    "W3": ("dtype", "batch", "flash_attn", "n_ubatch"),
    "W4": ("dtype", "flash_attn"),
    "W6": ("dtype", "flash_attn"),
    "W5": ("dtype", "flash_attn", "n_ubatch"),
}
N_BATCH = 2048  # logical batch: the most tokens one llama_decode call takes
MIN_SHARED_PREFIX = 256  # a shorter common prefix (W2's chat header) is prefilled with each prompt
NUM_THREADS = 2
# prompt-lookup decoding (W6): LlamaPromptLookupDecoding's defaults
LOOKUP_NGRAM = 2
LOOKUP_DRAFT = 10
INSTALL_HINT = "the llama.cpp peer needs llama-cpp-python: run `make bench-peers`"


class PeerConfig(NamedTuple):
    dtype: str
    batch: int
    flash_attn: bool
    n_ubatch: int

    def label(self, knobs: Sequence[str] = ("dtype", "batch", "flash_attn", "n_ubatch")) -> str:
        """e.g. `bf16 b32 fa-on ub512`, with only `knobs`."""
        parts = {"dtype": self.dtype, "batch": f"b{self.batch}",
                 "flash_attn": f"fa-{'on' if self.flash_attn else 'off'}", "n_ubatch": f"ub{self.n_ubatch}"}
        return " ".join(parts[k] for k in knobs)


def parse_peer_configs(spec: str) -> list[PeerConfig]:
    """`full` (FULL_SWEEP), `quick` (QUICK_CONFIGS) or comma-separated DTYPE:BATCH:FA:UBATCH, where
    FA is on/off and `*` stands for every value of FULL_SWEEP (e.g. `bf16:*:on:512`)."""
    spec = {"full": "*:*:*:*", "quick": QUICK_CONFIGS}.get(spec, spec)
    configs: list[PeerConfig] = []
    for item in spec.split(","):
        fields = item.strip().split(":")
        if len(fields) != 4:
            raise ValueError(f"peer config {item!r}: expected DTYPE:BATCH:FA:UBATCH")
        values = [_field_values(name, text) for name, text in zip(PeerConfig._fields, fields)]
        for combo in itertools.product(*values):
            config = PeerConfig(*combo)
            if config not in configs:
                configs.append(config)
    return configs


def llamacpp_configs(peers: str, spec: str) -> list[PeerConfig]:
    """The configurations to run for `--peers PEERS --peer-configs SPEC`: none unless PEERS names
    llama.cpp; ValueError for another peer, a bad SPEC, or llama-cpp-python not installed."""
    names = [name for name in peers.split(",") if name]
    if any(name != "llama.cpp" for name in names):
        raise ValueError(f"unknown peers {peers!r} (known: llama.cpp)")
    if not names:
        return []
    configs = parse_peer_configs(spec)
    try:
        import_llama_cpp()
    except RuntimeError as e:
        raise ValueError(str(e)) from e
    return configs


def _field_values(name: str, text: str) -> tuple[Any, ...]:
    if text == "*":
        return FULL_SWEEP[name]
    if name == "dtype":
        if text not in DTYPE_TO_FTYPE:
            raise ValueError(f"peer dtype {text!r}: one of {', '.join(DTYPE_TO_FTYPE)}")
        return (text,)
    if name == "flash_attn":
        if text not in ("on", "off"):
            raise ValueError(f"flash attention {text!r}: on or off")
        return (text == "on",)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} {text!r}: a positive integer")
    return (int(text),)


def configs_for(workload: str, configs: Sequence[PeerConfig]) -> list[PeerConfig]:
    """The first configuration of each distinct combination of the knobs `workload` depends on."""
    knobs = WORKLOAD_KNOBS[workload]
    seen: set[tuple[Any, ...]] = set()
    out = []
    for config in configs:
        key = tuple(getattr(config, k) for k in knobs)
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


def plan_waves(num_prompts: int, batch: int) -> list[range]:
    """Prompt indices run together: consecutive groups of at most `batch`."""
    return [range(start, min(start + batch, num_prompts)) for start in range(0, num_prompts, batch)]


def shared_prefix_len(token_lists: Sequence[Sequence[int]]) -> int:
    """Tokens prefilled once for every sequence: the common prefix, if at least MIN_SHARED_PREFIX
    long, less one token if a prompt would otherwise have none of its own (it needs logits)."""
    if len(token_lists) < 2:
        return 0
    first, n = token_lists[0], min(len(t) for t in token_lists)
    common = next((i for i in range(n) if any(t[i] != first[i] for t in token_lists)), n)
    common = min(common, n - 1)
    return common if common >= MIN_SHARED_PREFIX else 0


def gguf_name(dtype: str, source_sha256: str) -> str:
    """File name of the re-encoded GGUF: names the model, the type and the source file it came from."""
    from radixlm.runtime.model.model_files import DEFAULT_MODEL_NAME

    return f"{DEFAULT_MODEL_NAME}.{dtype.upper()}.from-{source_sha256[:12]}.gguf"


def ensure_gguf(dtype: str, out_dir: Path | None = None) -> Path:
    """The default model's GGUF in `dtype`: the source itself, or made from it once by llama.cpp's
    quantizer into `out_dir` (default <cache>/peers/; a temp name, then renamed: never half a file)."""
    from radixlm.runtime.model import model_files

    source = model_files.default_gguf_path()
    if dtype == SOURCE_DTYPE:
        return source
    out_dir = out_dir or model_files.cache_dir() / "peers"
    target = out_dir / gguf_name(dtype, model_files.DEFAULT_GGUF_SHA256)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lib = import_llama_cpp()
    params = lib.llama_model_quantize_default_params()
    params.ftype = DTYPE_TO_FTYPE[dtype]
    params.allow_requantize = True  # the source is already quantized
    params.nthread = NUM_THREADS
    part = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        if lib.llama_model_quantize(str(source).encode(), str(part).encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama_model_quantize {source} -> {dtype} failed")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return target


# llama.cpp built for one ISA level below the machine's, beside the native build (`make
# bench-peers`): compared with radixlm capped at the same level (RADIXLM_CPU_ISA). ggml's CPU
# switches of that build: GGML_NATIVE=OFF GGML_AVX512=OFF GGML_AVX2=ON GGML_FMA=ON GGML_F16C=ON.
LEVEL_PEER_DIRS = {"avx2": "llama-cpp-avx2"}
# On a CPU that reports AMX, `make bench-peers` also builds llama.cpp for AVX-512 (VNNI, BF16,
# VBMI) without AMX: where the VM does not let the native build's AMX kernels run, the peer loses
# all its extra weight buffers (repacked blocks too) unless it runs this build instead.
NO_AMX_PEER_DIR = "llama-cpp-noamx"


def peer_build_dir(level: str | None) -> Path | None:
    """Where the llama.cpp the peer loads lives (None: the native build in the environment):
    RADIXLM_PEER_BUILD if set; else the build for radixlm's ISA level `level`; at the native level
    the build without AMX where the native build's extra buffer types fail and that build is there."""
    from radixlm.runtime.config.envs import RADIXLM_PEER_BUILD
    from radixlm.runtime.model import model_files

    peers = model_files.cache_dir() / "peers"
    chosen = RADIXLM_PEER_BUILD.get()
    if chosen is not None:
        return None if chosen == "native" else peers / chosen
    name = LEVEL_PEER_DIRS.get(level or "")
    if name is not None:
        return peers / name
    if level in (None, "avx512") and (peers / NO_AMX_PEER_DIR / "llama_cpp").is_dir() \
            and not extra_buffer_types_work(native=True):
        return peers / NO_AMX_PEER_DIR
    return None


def import_llama_cpp() -> Any:
    """The llama_cpp module peer_build_dir picks for radixlm's ISA level (RADIXLM_CPU_ISA), quiet
    (its log goes to llama-cpp-python's logger, errors only)."""
    from radixlm.runtime.config.envs import RADIXLM_CPU_ISA

    build = peer_build_dir(RADIXLM_CPU_ISA.get())
    if build is not None:
        if not (build / "llama_cpp").is_dir():
            raise RuntimeError(f"no llama.cpp build in {build}: run `make bench-peers`")
        if "llama_cpp" not in sys.modules:
            sys.path.insert(0, str(build))
    try:
        import llama_cpp
    except ImportError as e:
        raise RuntimeError(INSTALL_HINT) from e
    if build is not None and not Path(llama_cpp.__file__).is_relative_to(build):
        raise RuntimeError(f"llama_cpp was imported from {llama_cpp.__file__} before the {build} build could be")
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    return llama_cpp


def peer_build_note() -> str:
    """Which llama.cpp build the peer runs, for a results table's notes (after import_llama_cpp)."""
    peers = Path(sys.modules["llama_cpp"].__file__).parent.parent
    if peers.parent.name == "peers":
        return f"llama.cpp: the {peers.name} build (`make bench-peers`, <cache>/peers/)"
    return "llama.cpp: the native build (llama-cpp-python in the environment)"


_PROBE = """
from radixlm.runtime.bench.llamacpp_peer import LlamaCppPeer, PeerConfig
LlamaCppPeer(PeerConfig("q4_1", 1, False, 512), extra_bufts=True).generate([list(range(100, 140))], 1)
"""


@functools.cache
def extra_buffer_types_work(native: bool = False) -> bool:
    """Whether llama.cpp's extra weight buffers (AMX, repacked blocks) run here: a child process
    tries a quantized prefill, with the build peer_build_dir picks (`native`: the native build).
    Where the CPU reports AMX that the VM does not let it use, the AMX kernel dies on its first tile
    instruction; then peers load without them."""
    env = {**os.environ, "RADIXLM_PEER_BUILD": "native"} if native else None
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=600, env=env)
    if probe.returncode != 0:
        print(f"llama.cpp: extra buffer types (AMX) off{' in the native build' if native else ''}: a quantized "
              f"prefill with them exits with {probe.returncode} on this machine", flush=True)
    return probe.returncode == 0


class LlamaCppPeer:
    """One configuration of llama.cpp behind run_system's interface (encode, generate, flush,
    extract). Owns a model, one context at a time (remade when a workload needs other sizes),
    a llama_batch of N_BATCH tokens and W4's grammar sampler; close() frees them."""

    name = "llama.cpp"
    extraction_modes = ("json_schema", "json_schema, lookup")

    def __init__(self, config: PeerConfig, kv_unified: bool | None = None, extra_bufts: bool | None = None,
                 model_path: Path | None = None):
        """`model_path`: a GGUF of another model (the MoE bench's), else the default model's in
        config.dtype (ensure_gguf)."""
        self.lib = lib = import_llama_cpp()
        self.config = config
        self.kv_unified = kv_unified  # None: unified iff the prompts share a prefix (see _context)
        lib.llama_backend_init()
        path = model_path or ensure_gguf(config.dtype)
        model_params = lib.llama_model_default_params()
        model_params.use_extra_bufts = extra_buffer_types_work() if extra_bufts is None else extra_bufts
        self.model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.batch = lib.llama_batch_init(N_BATCH, 0, 1)
        self.ctx: Any = None
        self.ctx_key: tuple[int, int, bool] | None = None  # (sequences, cells, unified)
        self.grammars: dict[str, Any] = {}  # extraction task name -> its grammar sampler
        self.grammar: Any = None  # the one in use

    def close(self) -> None:
        lib = self.lib
        for grammar in self.grammars.values():
            lib.llama_sampler_free(grammar)
        if self.ctx:
            lib.llama_free(self.ctx)
        lib.llama_batch_free(self.batch)
        lib.llama_model_free(self.model)
        self.grammars, self.grammar, self.ctx = {}, None, None

    def encode(self, text: str) -> list[int]:
        """Token ids as the workloads' prompts mean them: ChatML markers parsed, no BOS added."""
        data = text.encode()
        buf = (self.lib.llama_token * (len(data) + 8))()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize failed ({n})")
        return list(buf[:n])

    def flush(self) -> None:
        pass  # each call starts from an empty KV cache (see _context)

    def generate(self, prompts: list[str] | list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy `new_tokens` tokens for each prompt (EOS ignored); returns them per prompt."""
        token_lists = [p if isinstance(p, list) else self.encode(p) for p in prompts]
        prefix_len = shared_prefix_len(token_lists)
        num_seqs = min(self.config.batch, len(token_lists))
        ctx = self._context(num_seqs, max(len(t) for t in token_lists) + new_tokens, prefix_len)
        memory = self.lib.llama_get_memory(ctx)
        if prefix_len:
            prefix = token_lists[0][:prefix_len]
            self._decode(ctx, [(0, pos, token, False) for pos, token in enumerate(prefix)])
            for seq in range(1, num_seqs):
                self.lib.llama_memory_seq_cp(memory, 0, seq, -1, -1)
        generated: list[list[int]] = []
        for wave in plan_waves(len(token_lists), num_seqs):
            generated += self._run_wave(ctx, [token_lists[i] for i in wave], prefix_len, new_tokens)
            for seq in range(len(wave)):
                self.lib.llama_memory_seq_rm(memory, seq, prefix_len, -1)  # the shared prefix stays
        return generated

    def _run_wave(self, ctx: Any, token_lists: list[list[int]], start: int, new_tokens: int) -> list[list[int]]:
        """Sequence s holds token_lists[s][:start] already; prefill the rest, then decode in steps."""
        prefill = [(seq, pos, tokens[pos], pos == len(tokens) - 1)
                   for seq, tokens in enumerate(token_lists) for pos in range(start, len(tokens))]
        generated = [[token] for token in self._decode(ctx, prefill)]
        for step in range(1, new_tokens):
            entries = [(seq, len(token_lists[seq]) + step - 1, out[-1], True) for seq, out in enumerate(generated)]
            for out, token in zip(generated, self._decode(ctx, entries)):
                out.append(token)
        return generated

    def _decode(self, ctx: Any, entries: Sequence[tuple[int, int, int, bool]],
                pick: Callable[[np.ndarray], int] | None = None) -> list[int]:
        """Runs (seq_id, pos, token, wants_logits) entries through llama_decode, N_BATCH at a time;
        returns the token picked (default: argmax) from each output row, in the entries' order."""
        lib, batch, picked = self.lib, self.batch, []
        for start in range(0, len(entries), N_BATCH):
            chunk = entries[start : start + N_BATCH]
            for i, (seq, pos, token, wants_logits) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, wants_logits
            batch.n_tokens = len(chunk)
            status = lib.llama_decode(ctx, batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status} ({self.config.label()})")
            num_outputs = sum(1 for entry in chunk if entry[3])
            if num_outputs:
                # rows of the entries that asked for logits, in the batch's order (llama_get_logits)
                rows = np.ctypeslib.as_array(lib.llama_get_logits(ctx), shape=(num_outputs, self.n_vocab))
                picked += [int(t) for t in rows.argmax(axis=1)] if pick is None else [pick(row) for row in rows]
        return picked

    def _context(self, num_seqs: int, seq_len: int, shared_len: int = 0) -> Any:
        """An empty context for `num_seqs` sequences of up to `seq_len` tokens, the first
        `shared_len` common to all. Sequences that share a prefix share its cells in one unified
        KV cache (a step attends to every used cell, masked); otherwise each has a KV stream of
        its own (it attends only to its own cells)."""
        lib = self.lib
        unified = shared_len > 0 if self.kv_unified is None else self.kv_unified
        num_cells = shared_len + num_seqs * (seq_len - shared_len) if unified else num_seqs * -(-seq_len // 256) * 256
        key = (num_seqs, -(-num_cells // 256) * 256, unified)
        if key != self.ctx_key:
            if self.ctx:
                lib.llama_free(self.ctx)
            params = lib.llama_context_default_params()
            params.n_ctx, params.n_seq_max = key[1], num_seqs
            params.n_batch, params.n_ubatch = N_BATCH, min(self.config.n_ubatch, N_BATCH)
            params.n_threads = params.n_threads_batch = NUM_THREADS
            params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.config.flash_attn
                                      else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
            params.kv_unified = unified
            params.no_perf = True
            self.ctx = lib.llama_init_from_model(self.model, params)
            if not self.ctx:
                raise RuntimeError(f"llama.cpp cannot make a context {key} ({self.config.label()})")
            self.ctx_key = key
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), False)
        return self.ctx

    def forget_outputs(self, mode: str) -> None:
        pass  # its prompt lookup reads the request's own tokens only

    def extract(self, prompt: str, mode: str, task: Any) -> str:
        """One extraction of `task` (bench.extraction.ExtractionTask) constrained by its schema as
        a GBNF grammar, greedy; in mode "json_schema, lookup" with prompt-lookup drafts."""
        if mode not in self.extraction_modes:
            raise ValueError(f"llama.cpp peer: extraction mode {mode!r} is not run")
        lib = self.lib
        if task.name not in self.grammars:
            from llama_cpp.llama_grammar import json_schema_to_gbnf

            gbnf = json_schema_to_gbnf(json.dumps(task.schema))
            self.grammars[task.name] = lib.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        self.grammar = self.grammars[task.name]
        lib.llama_sampler_reset(self.grammar)
        tokens = self.encode(prompt)
        ctx = self._context(1, len(tokens) + task.max_tokens + LOOKUP_DRAFT)
        memory = lib.llama_get_memory(ctx)
        out = self._decode(ctx, [(0, pos, token, pos == len(tokens) - 1) for pos, token in enumerate(tokens)],
                           self._constrained_argmax)
        while not lib.llama_vocab_is_eog(self.vocab, out[-1]) and len(out) < task.max_tokens:
            draft = lookup_draft(tokens + out)[: task.max_tokens - len(out) - 1] if mode.endswith("lookup") else []
            first = len(tokens) + len(out) - 1  # the position of the last token, fed now
            rows: list[np.ndarray] = []
            self._decode(ctx, [(0, first + j, t, True) for j, t in enumerate([out[-1], *draft])],
                         lambda row, into=rows: into.append(row.copy()) or 0)
            for j, row in enumerate(rows):
                out.append(self._constrained_argmax(row))
                if lib.llama_vocab_is_eog(self.vocab, out[-1]) or j == len(draft) or out[-1] != draft[j]:
                    break
            lib.llama_memory_seq_rm(memory, 0, first + j + 1, -1)  # the K/V of the rejected drafts
        return self._detokenize([t for t in out if not lib.llama_vocab_is_eog(self.vocab, t)])

    def _constrained_argmax(self, row: np.ndarray) -> int:
        """The argmax if the grammar accepts it, else the argmax of the grammar-masked row; accepted."""
        lib = self.lib
        token = int(row.argmax())
        if not self._grammar_allows(np.array([token], np.int32), row[[token]])[0]:
            allowed = self._grammar_allows(np.arange(self.n_vocab, dtype=np.int32), row)
            token = int(np.where(allowed, row, -np.inf).argmax())
        lib.llama_sampler_accept(self.grammar, token)
        return token

    def _grammar_allows(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """Which of `ids` the grammar sampler leaves finite (in its current state, not advanced)."""
        lib = self.lib
        data = np.zeros(len(ids), dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        data["id"], data["logit"] = ids, logits
        candidates = lib.llama_token_data_array(
            data=data.ctypes.data_as(lib.llama_token_data_p), size=len(ids), selected=-1, sorted=False
        )
        lib.llama_sampler_apply(self.grammar, ctypes.byref(candidates))
        return np.isfinite(data["logit"])

    def _detokenize(self, tokens: list[int]) -> str:
        buf = ctypes.create_string_buffer(256)
        pieces = []
        for token in tokens:
            n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            pieces.append(buf.raw[: max(n, 0)])
        return b"".join(pieces).decode("utf-8", errors="replace")


def lookup_draft(history: Sequence[int]) -> list[int]:
    """Up to LOOKUP_DRAFT tokens that followed the latest earlier occurrence of the history's last
    n tokens (n = LOOKUP_NGRAM down to 1); empty when none occurred before."""
    for n in range(min(LOOKUP_NGRAM, len(history) - 1), 0, -1):
        tail = list(history[-n:])
        for start in range(len(history) - n - 1, -1, -1):
            if list(history[start : start + n]) == tail:
                return list(history[start + n : start + n + LOOKUP_DRAFT])
    return []


def run_llamacpp(workloads: Sequence[str], configs: Sequence[PeerConfig], repeats: int,
                 run_system: Callable[[Any, list[str], int], Result]) -> dict[PeerConfig, Result]:
    """Figures of every configuration, each on the workloads that depend on its knobs."""
    results: dict[PeerConfig, Result] = {}
    for config in configs:
        todo = [w for w in workloads if config in configs_for(w, configs)]
        if not todo:
            continue
        peer = LlamaCppPeer(config)
        if not results and hasattr(peer, "lib"):  # which build ran, once
            print(f"llama.cpp peer: {peer.lib.__file__}; {peer.lib.llama_print_system_info().decode().strip()}", flush=True)
        try:
            results[config] = run_system(peer, todo, repeats)
        finally:
            peer.close()
        print(f"llama.cpp {config.label()}: {json.dumps({k: round(v, 3) for k, v in results[config].items()})}",
              flush=True)
    return results


def is_lower_better(metric: str) -> bool:
    return metric.endswith(" s") or metric.endswith("s/request")


def best_of(figures: dict[str, Result]) -> dict[str, tuple[float, str]]:
    """metric -> (best value over the labelled results, its label)."""
    best: dict[str, tuple[float, str]] = {}
    for label, result in figures.items():
        for metric, value in result.items():
            if metric not in best or (value < best[metric][0] if is_lower_better(metric) else value > best[metric][0]):
                best[metric] = (value, label)
    return best


def print_peer_summary(ours: dict[str, Result], base: dict[str, Result],
                       peer: dict[PeerConfig, Result], results: ResultTables | None = None) -> None:
    """Per metric: each system's best (radixlm and transformers over dtypes, llama.cpp over its
    configurations, labelled with the knobs the workload depends on) and radixlm's ratios
    (>1: radixlm is better)."""
    rows = table_rows(results, "best", "best configurations: radixlm, transformers, llama.cpp")
    peer_labelled = {}
    for config, result in peer.items():
        for metric, value in result.items():
            knobs = WORKLOAD_KNOBS[metric.split()[0]]
            peer_labelled.setdefault(config.label(knobs), {})[metric] = value
    systems = [best_of(ours), best_of(base), best_of(peer_labelled)]
    print("\n## best configurations: radixlm, transformers, llama.cpp")
    print("| metric | radixlm | transformers | llama.cpp | vs transformers | vs llama.cpp |")
    print("|---|---|---|---|---|---|")
    names = ("radixlm", "transformers", "llama.cpp")
    for metric in dict.fromkeys(itertools.chain(*systems)):
        cells = [f"{s[metric][0]:.2f} ({s[metric][1]})" if metric in s else "-" for s in systems]
        ratios = []
        ratio_values: dict[str, float | None] = {}
        for name, other in zip(names[1:], systems[1:]):
            if metric not in systems[0] or metric not in other or not (is_lower_better(metric) or
                                                                      metric.endswith("tok/s")):
                ratios.append("-")
                continue
            ours_value, other_value = systems[0][metric][0], other[metric][0]
            ratio = ratio_values[name] = other_value / ours_value if is_lower_better(metric) else ours_value / other_value
            ratios.append(f"{ratio:.2f}x")
        print(f"| {metric} | {' | '.join(cells)} | {' | '.join(ratios)} |")
        rows.append(comparison_row(metric, {name: s[metric] for name, s in zip(names, systems) if metric in s},
                                   ratio_values))


# our --dtypes names -> llama.cpp's GGUF types
_PEER_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "q4_1": "q4_1", "q8_0": "q8_0", "q4_0": "q4_0"}


def peer_dtype(precision: str) -> str | None:
    """The GGUF type llama.cpp runs at radixlm's --dtypes entry `precision` (None: no such file)."""
    return _PEER_DTYPE.get(precision.partition("/")[0])


def print_same_precision(ours: dict[str, Result], peer: dict[PeerConfig, Result],
                         results: ResultTables | None = None) -> None:
    """Per precision both ran (radixlm's bfloat16 against llama.cpp's bf16 GGUF, its q4_1 against
    the same q4_1 file, ...): each metric's best llama.cpp configuration at that precision and
    radixlm's ratio (>1: radixlm is better)."""
    rows = table_rows(results, "same_precision", "same precision: radixlm against llama.cpp's best configuration "
                      "of that GGUF type")
    print("\n## same precision: radixlm against llama.cpp's best configuration of that GGUF type")
    print("| precision | metric | radixlm | llama.cpp | ratio |")
    print("|---|---|---|---|---|")
    for precision, result in ours.items():
        gguf_type = peer_dtype(precision)
        theirs = best_of({c.label(): r for c, r in peer.items() if c.dtype == gguf_type})
        for metric, value in result.items():
            if metric not in theirs or not (is_lower_better(metric) or metric.endswith("tok/s")):
                continue
            other, label = theirs[metric]
            ratio = other / value if is_lower_better(metric) else value / other
            print(f"| {precision} | {metric} | {value:.2f} | {other:.2f} ({label}) | {ratio:.2f}x |")
            rows.append(comparison_row(metric, {"radixlm": (value, None), "llama.cpp": (other, label)},
                                       {"llama.cpp": ratio}, precision))
