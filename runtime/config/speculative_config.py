"""Speculative decoding's settings (`--speculative-algorithm` and the flags after it, SGLang's
names), checked once. What the scheduler does with them: scheduler/speculative.py."""

from __future__ import annotations

from dataclasses import dataclass

# --speculative-algorithm's values: NGRAM (prompt-lookup drafts for every request); STANDALONE (a
# smaller draft model with the target's vocabulary, --speculative-draft-model-path); NONE (no
# drafts but jump-forward's forced tokens). Unset, the default: NGRAM for the requests under a
# grammar only (`constrained_only`), where the bench shows it wins and never loses
# (docs/constrained.md); free text decodes as with NONE.
SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE", "NONE")


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str = "NGRAM"
    num_draft_tokens: int = 4  # tokens drafted per request per step on a fresh match (see scheduler/speculative.py)
    # an n-gram draft needs the last `min` tokens to occur earlier; matches are ranked by how far
    # (up to `max` tokens) the context before them agrees
    ngram_min_match_window_size: int = 3
    ngram_max_match_window_size: int = 12
    # NGRAM: tokens of earlier requests' outputs kept for drafting (0: none; scheduler/ngram_cache.py)
    ngram_capacity: int = 100_000
    draft_model_path: str | None = None  # STANDALONE: the draft model (a directory or what --model-path takes)
    # the default (--speculative-algorithm unset): n-gram drafts for requests under a grammar only
    constrained_only: bool = False

    def __post_init__(self) -> None:
        if self.algorithm not in SPECULATIVE_ALGORITHMS or self.algorithm == "NONE":
            raise ValueError(f"speculative_algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)}, "
                             f"got {self.algorithm!r}")
        if self.algorithm == "STANDALONE" and not self.draft_model_path:
            raise ValueError("--speculative-algorithm STANDALONE needs --speculative-draft-model-path (a smaller "
                             "model with the same tokenizer)")
        if self.algorithm != "STANDALONE" and self.draft_model_path:
            raise ValueError(f"--speculative-draft-model-path is used by --speculative-algorithm STANDALONE only "
                             f"(the algorithm is {self.algorithm})")
        if self.num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.ngram_capacity < 0:
            raise ValueError(f"speculative_ngram_capacity must be >= 0, got {self.ngram_capacity}")
        if not 1 <= self.ngram_min_match_window_size <= self.ngram_max_match_window_size:
            raise ValueError("need 1 <= speculative_ngram_min_match_window_size <= "
                             "speculative_ngram_max_match_window_size, got "
                             f"{self.ngram_min_match_window_size} and {self.ngram_max_match_window_size}")
