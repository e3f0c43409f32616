"""Everything one scheduler needs, built from ServerArgs: model files -> ModelRunner (weights, KV
pool), tokenizer, GrammarBackend, Scheduler. Shared by the in-process Engine and the scheduler
process, so both build the same stack and make requests the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixlm.formats.reasoning import reasoning_format
from radixlm.runtime.config.server_args import ServerArgs
from radixlm.runtime.constrained import backends as grammar_backends
from radixlm.runtime.constrained.grammar import NUM_GRAMMAR_COMPILE_WORKERS, GrammarBackend
from radixlm.runtime.constrained.lowered import LoweredGrammar
from radixlm.runtime.detokenizer.detokenizer import IncrementalDecoder
from radixlm.runtime.model.kernel_policy import cpu_isa
from radixlm.runtime.model.model_config import ModelConfig
from radixlm.runtime.model.model_runner import ModelRunner, RunnerConfig, quantizes
from radixlm.runtime.sampling.sampling_params import SamplingParams
from radixlm.runtime.scheduler.draft_model import load_draft_runner
from radixlm.runtime.scheduler.kv_events_publisher import KVEventStream
from radixlm.runtime.scheduler.req import LogprobOptions, Req
from radixlm.runtime.scheduler.scheduler import Scheduler, SchedulerConfig, grammar_spec
from radixlm.runtime.scheduler.token_matcher import TokenSequenceMatcher
from radixlm.runtime.tokenizer.tokenizer import Tokenizer

if TYPE_CHECKING:  # the backends load with their library, only when chosen (`grammar_backends.create`):
    # importing llguidance.torch alone took ~2 s of every scheduler's start
    from radixlm.runtime.constrained.llguidance_backend import LLGuidanceBackend
    from radixlm.runtime.constrained.xgrammar_backend import XGrammarBackend


@dataclass
class SchedulerStack:
    server_args: ServerArgs
    model_config: ModelConfig
    tokenizer: Tokenizer
    runner: ModelRunner
    grammar_backend: GrammarBackend | XGrammarBackend | LLGuidanceBackend
    scheduler: Scheduler
    eos_ids: frozenset[int]
    # the end-of-reasoning marker of --reasoning-parser as token ids (empty: no reasoning parser)
    think_end_ids: tuple[int, ...] = ()

    @classmethod
    def build(cls, args: ServerArgs, dp_rank: int = 0) -> SchedulerStack:
        from radixlm.runtime.model.model_files import resolve_model_path

        model_dir = resolve_model_path(args.model_path)
        model_config = ModelConfig.from_dir(model_dir)
        tokenizer = Tokenizer(args.tokenizer_path or model_dir)
        runner_cfg = RunnerConfig.from_server_args(args, model_config,
                                                   quantized=quantizes(model_dir, args.resolved_quantization))
        runner = ModelRunner.from_dir(model_dir, runner_cfg, args.tp_size)
        spec = args.speculative
        draft_runner = None
        if spec is not None and spec.draft_model_path is not None:
            try:
                draft_runner = load_draft_runner(spec.draft_model_path, runner, tokenizer)
            except BaseException:
                runner.close()
                raise
        grammar_backend = grammar_backends.create(
            args.grammar_backend, tokenizer, model_config.vocab_size, num_workers=NUM_GRAMMAR_COMPILE_WORKERS,
            enable_jump_forward=not args.disable_jump_forward,
            whitespace_pattern=args.constrained_json_whitespace_pattern,
            compile_memory_mb=args.grammar_compile_memory_mb,
        )
        scheduler = Scheduler(
            runner,
            SchedulerConfig(
                context_len=runner_cfg.context_len,
                max_running_requests=args.max_running_requests,
                chunked_prefill_size=args.chunked_prefill_size,
                schedule_policy=args.schedule_policy,
                disable_radix_cache=args.disable_radix_cache,
                random_seed=args.random_seed,
                speculative=args.speculative,
            ),
            grammar_backend,
            kv_events=None if args.kv_events is None else KVEventStream(args.kv_events, dp_rank),
            draft_runner=draft_runner,
        )
        eos = set(model_config.eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        think_end_ids = () if args.reasoning_parser is None else \
            tuple(tokenizer.encode_plain(reasoning_format(args.reasoning_parser).end))
        return cls(args, model_config, tokenizer, runner, grammar_backend, scheduler, frozenset(eos), think_end_ids)

    @property
    def context_len(self) -> int:
        return self.scheduler.cfg.context_len

    def make_req(
        self, rid: str, ids: list[int], params: SamplingParams, logprob: LogprobOptions, track_text: bool = True,
        require_reasoning: bool = False, grammar: LoweredGrammar | None = None, cache_salt: str | None = None,
    ) -> Req:
        """A scheduler request for already validated input ids. Its IncrementalDecoder makes the
        text (the Engine's output) and watches for stop strings; a server's scheduler, whose text
        comes from the detokenizer, needs it only when there are stop strings or regexes
        (`track_text=False`), and then sends its text (`ReqOutput.new_text`) in place of the detokenizer's.
        `require_reasoning` (SGLang's): the output starts with reasoning, so with a reasoning
        parser its grammar, if any, applies only after the end-of-reasoning marker. `grammar`: the
        front door's lowering of its grammar, compiled as it is. `cache_salt`: its prefix-cache
        namespace (no prefix shared with other salts)."""
        decoder = IncrementalDecoder(self.tokenizer, params, ids) if track_text or params.stop or params.stop_regex else None
        req = Req(rid, ids, params, self.eos_ids, logprob, decoder, lowered_grammar=grammar, cache_salt=cache_salt)
        if require_reasoning and self.think_end_ids and grammar_spec(params) is not None:
            req.reasoning_end = TokenSequenceMatcher(self.think_end_ids)
        return req

    def server_info(self) -> dict[str, Any]:
        """The settings (no secrets) and the scheduler's live state, as /get_server_info shows them."""
        sched = self.scheduler
        cache = sched.cache
        return {
            "dp_size": self.server_args.dp_size, "tp_size": self.server_args.tp_size,  # as SGLang (sglang-router --dp-aware reads dp_size)
            **self.server_args.public_dict(),
            "model_path": str(self.server_args.model_path or "default:SmolLM2-135M-Instruct"),
            # as SGLang: the tokenizer's directory even when the flag is unset (sglang-router loads
            # its own copy from here; a name it cannot find on disk it would look up on the hub)
            "tokenizer_path": self.tokenizer.path,
            "context_length": self.context_len,
            "max_total_num_tokens": sched.kv_pool.max_total_num_tokens,  # the KV pool's size, where SGLang has it
            # fields marked "deprecated": old names of renamed ones (issue 36), sent beside the new names until the
            # next release (docs/http-api.md lists them); they go with their `deprecated` fields in runtime.protocol
            "kv_pool": {"free_tokens": sched.kv_pool.num_free,
                        "total_tokens": sched.kv_pool.max_total_num_tokens},  # deprecated
            "tp_worker_pids": [] if self.runner.tp_workers is None else [p.pid for p in self.runner.tp_workers.procs],
            "radix_cache": {
                "tree_tokens": cache.tree_tokens,
                "evictable_tokens": cache.evictable_tokens,
                "hit_rate": cache.hit_rate,
                "num_queried_tokens": cache.num_queried_tokens,  # hit_rate's denominator and numerator
                "num_matched_tokens": cache.num_matched_tokens,
                "num_evicted_tokens": sched.bridge.num_evicted_tokens,
                "cached_tokens": cache.tree_tokens, "evicted_tokens": sched.bridge.num_evicted_tokens,  # deprecated
            },
            "num_running_reqs": len(sched.running) + (1 if sched.chunked_req else 0),
            "num_waiting_reqs": len(sched.waiting),
            "num_grammar_queue_reqs": len(sched.grammar_waiting),  # waiting for their grammar to compile
            "num_retractions": sched.num_retractions,
            **sched.drafter.server_info(),
            **self._kernel_info(),
        }

    def _kernel_info(self) -> dict[str, Any]:
        """What the model runs in: the resolved dtype and, on CPU, the C++ kernels' ISA level and
        the features they use (null where torch ops do all the work)."""
        runner = self.runner
        uses_kernels = runner.cfg.device == "cpu" and (runner.cpu_kernels or runner.quantized_layers > 0)
        chosen = cpu_isa() if uses_kernels else None
        return {
            "resolved_dtype": str(runner.cfg.dtype).removeprefix("torch."),
            "resolved_kv_dtype": str(runner.kv_pool.dtype).removeprefix("torch."),
            "quantized_activations_mode": runner.cfg.quant_mode if runner.quantized_layers else None,
            "cpu_isa": chosen.level if chosen else None,
            "cpu_isa_features": sorted(chosen.features) if chosen else [],
        }

    def abort_all(self) -> None:
        """Abort everything queued or running and step until its memory is released."""
        sched = self.scheduler
        for req in list(sched.waiting) + list(sched.running):
            sched.abort(req.rid)
        if sched.chunked_req is not None:
            sched.abort(sched.chunked_req.rid)
        while sched.has_work:
            sched.step()
