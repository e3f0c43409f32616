"""Chat roles as text: what a model's chat template puts before and after each role's content.

A program writes `s += user("hi")`; the interpreter needs the text the model's chat template
wraps around "hi". Templates are Jinja programs over whole conversations, so the wrappers are
derived once by rendering small conversations with sentinel contents and cutting at the
sentinels (`derive_chat_template`). The server does this with its tokenizer's template and
publishes the result in `/get_model_info` (`chat_template`), so a client needs no Jinja and no
tokenizer; a server that does not publish one (e.g. a real SGLang server) gets ChatML, which is
what most instruction-tuned models of this family use.

A template may open a conversation differently (SmolLM2 adds a default system prompt when the
first message is not a system message): `first_prefix[role]` holds that opening when it differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
_SENTINEL = {role: f"RADIXLMSENTINEL{role.upper()}7Q" for role in ROLES}


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    roles: dict[str, tuple[str, str]]  # role -> (prefix, suffix) inside a conversation
    first_prefix: dict[str, str] = field(default_factory=dict)  # role -> prefix when it opens one

    def prefix(self, role: str, first: bool) -> str:
        if first and role in self.first_prefix:
            return self.first_prefix[role]
        return self._wrap(role)[0]

    def suffix(self, role: str) -> str:
        return self._wrap(role)[1]

    def _wrap(self, role: str) -> tuple[str, str]:
        if role in self.roles:
            return self.roles[role]
        raise ValueError(f"the chat template {self.name!r} has no role {role!r} (it has {sorted(self.roles)})")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "roles": {r: list(v) for r, v in self.roles.items()}, "first_prefix": self.first_prefix}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChatTemplate:
        roles = {str(r): (str(v[0]), str(v[1])) for r, v in d["roles"].items()}
        return cls(str(d.get("name", "server")), roles, {str(k): str(v) for k, v in d.get("first_prefix", {}).items()})


CHATML = ChatTemplate("chatml", {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ROLES})


def derive_chat_template(render: Callable[[list[dict[str, str]]], str], name: str = "model") -> ChatTemplate | None:
    """Role wrappers of the template `render` applies (messages -> text, no generation prompt).

    Returns None when the template does not render conversations incrementally (each longer
    conversation extending the text of the shorter one), the only shape this can describe.
    """
    try:
        roles: dict[str, tuple[str, str]] = {}
        history: list[dict[str, str]] = []
        previous = ""
        for role in ROLES:
            history.append({"role": role, "content": _SENTINEL[role]})
            try:
                text = render(history)
            except Exception:  # templates raise on roles they do not know (often "tool")
                if role == "tool":
                    roles["tool"] = roles["user"]
                    break
                return None
            if not text.startswith(previous) or text.count(_SENTINEL[role]) != 1:
                return None
            block = text[len(previous) :]
            before, after = block.split(_SENTINEL[role])
            roles[role] = (before, after)
            previous = text
        first_prefix: dict[str, str] = {}
        for role in ("user", "assistant"):
            try:
                alone = render([{"role": role, "content": _SENTINEL[role]}])
            except Exception:
                continue
            before, _, after = alone.partition(_SENTINEL[role])
            if after == roles[role][1] and before != roles[role][0]:
                first_prefix[role] = before
        return ChatTemplate(name, roles, first_prefix)
    except Exception:  # a template that breaks on sentinel conversations: the caller falls back
        return None
