"""Crusoe: a program's backend on Crusoe's managed inference, an OpenAI-compatible API (the
`OpenAI` backend's mapping, chat models), as SGLang's `Crusoe`: `Crusoe(model_name,
api_key=None, base_url=None, chat_template=None, **client_kwargs)`, the key from CRUSOE_API_KEY
when not given (required), `base_url` defaulting to Crusoe's endpoint."""

from __future__ import annotations

import os
from typing import Any

from radixlm.backend.openai import OpenAI
from radixlm.formats.chat_template import ChatTemplate

CRUSOE_BASE_URL = "https://managed-inference-api-proxy.crusoecloud.com/v1/"


class Crusoe(OpenAI):
    def __init__(self, model_name: str, api_key: str | None = None, base_url: str | None = None,
                 chat_template: ChatTemplate | None = None, **client_kwargs: Any):
        api_key = api_key or os.environ.get("CRUSOE_API_KEY")
        if not api_key:
            raise ValueError("Crusoe needs an API key: pass api_key= or set CRUSOE_API_KEY")
        super().__init__(model_name, base_url=base_url or CRUSOE_BASE_URL, api_key=api_key, is_chat_model=True,
                         chat_template=chat_template, **client_kwargs)
