"""LiteLLM: a program's backend through a LiteLLM proxy, over the proxy's OpenAI-compatible HTTP
API (the `OpenAI` backend's mapping; chat models). The in-process `litellm` library that SGLang's
LiteLLM backend calls is not used: point `base_url` at a proxy (`litellm --model ...`), or at any
OpenAI-compatible server such as ours.

`LiteLLM(model_name, chat_template=None, api_key=None, organization=None, base_url=None,
timeout=600, max_retries=1, default_headers=None)` (SGLang's signature): `base_url` defaults to
LITELLM_PROXY_API_BASE, else the proxy's default http://0.0.0.0:4000; `api_key` to
LITELLM_PROXY_API_KEY (a proxy without keys takes any).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from radixlm.backend.openai import OpenAI
from radixlm.formats.chat_template import ChatTemplate

LITELLM_PROXY_URL = "http://0.0.0.0:4000"


class LiteLLM(OpenAI):
    def __init__(
        self,
        model_name: str,
        chat_template: ChatTemplate | None = None,
        api_key: str | None = None,
        organization: str | None = None,
        base_url: str | None = None,
        timeout: float | None = 600,
        max_retries: int | None = 1,
        default_headers: Mapping[str, str] | None = None,
    ):
        base_url = base_url or os.environ.get("LITELLM_PROXY_API_BASE") or LITELLM_PROXY_URL
        api_key = api_key or os.environ.get("LITELLM_PROXY_API_KEY") or "EMPTY"
        extra: dict[str, Any] = {"timeout": timeout, "default_headers": default_headers, "organization": organization}
        if max_retries is not None:
            extra["max_retries"] = max_retries
        super().__init__(model_name, base_url=base_url, api_key=api_key, is_chat_model=True,
                         chat_template=chat_template, **{k: v for k, v in extra.items() if v is not None})
