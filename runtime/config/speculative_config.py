"""Speculative decoding's settings (`--speculative-algorithm` and the flags after it, SGLang's
names), checked once. What the scheduler does with them: scheduler/speculative.py."""

from __future__ import annotations

from dataclasses import dataclass

# --speculative-algorithm's values: NGRAM (prompt-lookup drafts); STANDALONE (a draft model) is
# named so that asking for it gets a clear refusal rather than argparse's list
SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE")
STANDALONE_REFUSAL = ("--speculative-algorithm STANDALONE (a draft model) is not supported yet; "
                      "--speculative-algorithm NGRAM drafts from the prompt without one")


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str = "NGRAM"
    num_draft_tokens: int = 4  # tokens drafted per request per step on a fresh match (see scheduler/speculative.py)
    # an n-gram draft needs the last `min` tokens to occur earlier; matches are ranked by how far
    # (up to `max` tokens) the context before them agrees
    ngram_min_match_window_size: int = 3
    ngram_max_match_window_size: int = 12

    def __post_init__(self) -> None:
        if self.algorithm == "STANDALONE":
            raise ValueError(STANDALONE_REFUSAL)
        if self.algorithm != "NGRAM":
            raise ValueError(f"speculative_algorithm must be NGRAM, got {self.algorithm!r}")
        if self.num_draft_tokens < 1:
            raise ValueError(f"speculative_num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if not 1 <= self.ngram_min_match_window_size <= self.ngram_max_match_window_size:
            raise ValueError("need 1 <= speculative_ngram_min_match_window_size <= "
                             "speculative_ngram_max_match_window_size, got "
                             f"{self.ngram_min_match_window_size} and {self.ngram_max_match_window_size}")
