"""The tokenizer: HF fast tokenizer files from the model directory, used through a small facade."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# tokenizer_config classes that are transformers' plain fast tokenizer: loaded through that class
# directly, since `transformers.AutoTokenizer` imports torch (its config module does), ~250 MB
# in each process that only tokenizes (the HTTP front, the detokenizer)
_PLAIN_FAST_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def _load(path: Path) -> Any:
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("tokenizer_class") in _PLAIN_FAST_CLASSES and (path / "tokenizer.json").is_file():
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


class Tokenizer:
    def __init__(self, path: str | Path, chat_template: str | None = None):
        self.path = str(path)  # where it was loaded from
        try:
            self._tok = _load(Path(path))
        except Exception as e:  # transformers raises many types for bad tokenizer files
            raise ValueError(f"{path}: cannot load tokenizer ({e})") from e
        self.vocab_size = len(self._tok)
        self.eos_token_id: int | None = self._tok.eos_token_id
        self.bos_token_id: int | None = self._tok.bos_token_id
        self.all_special_ids: frozenset[int] = frozenset(self._tok.all_special_ids)
        self.chat_template: str | None = _read_template(chat_template) or getattr(self._tok, "chat_template", None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; without `add_special_tokens`, none added (no BOS), while the
        special tokens written in `text` (a chat template's markers) stay."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` without the special tokens (BOS) the tokenizer may add: text to
        append to an output (jump-forward drafts, budget plans)."""
        return [i for i in self._tok.encode(text) if i not in self.all_special_ids]

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        return self._tok.decode(
            list(ids),
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return list(self._tok.convert_ids_to_tokens(list(ids)))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, chat_template: str | None = None,
        continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text of `messages`. `continue_final_message`: the last message (the
        assistant's) is left open to be continued, and no generation prompt follows it;
        `template_kwargs` are variables for the template (SGLang's `chat_template_kwargs`);
        `tools` (OpenAI's shape) for a template that renders them."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError("this model's tokenizer has no chat template; pass --chat-template")
        return self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
            chat_template=template, continue_final_message=continue_final_message, tools=tools,
            **(template_kwargs or {}),
        )


def _read_template(value: str | None) -> str | None:
    """A chat template given as a file path or as the template text itself."""
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and "{" not in value and path.is_file():
        return path.read_text()
    return value
