"""The program expressions a state is extended with: text, gen, select, roles, variable scopes,
images and videos, reasoning separation.

Expressions are plain values; the interpreter (`interpreter.py`) gives them meaning. `a + b`
concatenates (a str on either side becomes text), so `s += "Q: " + gen("a")` is one
expression that runs in order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from radixlm.choices import BUILTIN_METHODS, ScoredChoicesMethod, as_choices_method
from radixlm.formats.reasoning import REASONING_PARSERS, reasoning_format
from radixlm.typed import OutputType, is_output_type

# dtype= in gen: the constraint each type implies (the variable stays text, as in SGLang).
DTYPE_REGEX = {
    int: r"[-+]?[0-9]{1,18}",
    float: r"[-+]?[0-9]{1,12}(\.[0-9]{1,12})?",
    bool: r"(True|False)",
    str: r'"[^"\\\n]{0,256}"',
}
_DTYPE_NAMES = {"int": int, "float": float, "bool": bool, "str": str}

# the built-in choices methods by name (select takes a name or a method object, choices.py)
TOKEN_LENGTH_NORMALIZED = "token_length_normalized"
GREEDY_TOKEN_SELECTION = "greedy_token_selection"
UNCONDITIONAL_LIKELIHOOD_NORMALIZED = "unconditional_likelihood_normalized"
CHOICES_METHODS = tuple(BUILTIN_METHODS)


class Expr:
    def __add__(self, other: Any) -> Concat:
        return Concat([self, as_expr(other)])

    def __radd__(self, other: Any) -> Concat:
        return Concat([as_expr(other), self])


@dataclass
class Text(Expr):
    text: str


@dataclass
class Concat(Expr):
    parts: list[Expr]


@dataclass
class SamplingArgs:
    """gen()'s sampling arguments; None means "the program's default" (see `merged`)."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None  # > 1: that many samples; the variable is their list
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None  # set by a backend for tool_choice="auto", not by gen()

    def merged(self, defaults: SamplingArgs) -> SamplingArgs:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in values.items():
            if value is None:
                values[name] = getattr(defaults, name)
        return SamplingArgs(**values)

    def to_native(self) -> dict[str, Any]:
        """The native API's sampling_params (unset fields left to the server's defaults)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        for key in ("stop", "stop_regex"):
            if isinstance(out.get(key), str):
                out[key] = [out[key]]
        return out


@dataclass
class Gen(Expr):
    name: str | None
    sampling: SamplingArgs
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = "auto"
    output_type: OutputType | None = None  # gen(json_schema=T) for a type T (typed.py)
    # inside separate_reasoning: the output starts with reasoning, so a server with a reasoning
    # parser applies the gen's grammar after it (the native API's `require_reasoning`)
    require_reasoning: bool = False


@dataclass
class Select(Expr):
    name: str | None
    choices: list[str]
    temperature: float = 0.0
    choices_method: Any = TOKEN_LENGTH_NORMALIZED  # a built-in method's name, or a method object


@dataclass
class Media(Expr):
    """An image or a video in a message (`image`, `video`). Backends whose model has no vision
    support refuse it; a vision backend turns it into the model's image tokens and the chat
    API's content parts (`Backend.add_media`)."""

    kind: str  # "image" | "video"
    source: str | bytes  # a file path, an http(s) or data: URL, or the raw bytes
    num_frames: int | None = None  # videos: frames sampled from the clip


@dataclass
class SeparateReasoning(Expr):
    """Run `expr`, then split each variable it generated into its answer (`{name}`) and its
    reasoning (`{name}_reasoning_content`) by the format `model_type` (`separate_reasoning`)."""

    expr: Expr
    model_type: str


@dataclass
class RoleBegin(Expr):
    role: str


@dataclass
class RoleEnd(Expr):
    role: str


@dataclass
class VarScopeBegin(Expr):
    name: str


@dataclass
class VarScopeEnd(Expr):
    name: str


@dataclass
class ToolResult(Expr):
    """The result of a tool call as a `tool` message (see ProgramState.run_tool)."""

    content: str
    call_id: str | None = None
    name: str | None = None


@dataclass
class Fork:  # not an Expr: forks are made by ProgramState.fork, never appended
    n: int
    extra: dict[str, Any] = field(default_factory=dict)


def as_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, (list, tuple)):
        return Concat([as_expr(v) for v in value])
    raise TypeError(f"cannot add a {type(value).__name__} to a program state (use str, gen, select, roles)")


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: Any = TOKEN_LENGTH_NORMALIZED,
    regex: str | None = None,
    json_schema: Any = None,
    ebnf: str | None = None,
    tools: list[Any] | None = None,
    tool_choice: Any = "auto",
    max_new_tokens: int | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
) -> Gen | Select:
    """Generate into variable `name` (SGLang's arguments, in SGLang's order). With `choices` it is
    `select`; `dtype`, `regex`, `json_schema` and `ebnf` (an EBNF grammar; a server with
    --grammar-backend xgrammar) constrain the output, and `json_schema` may be a pydantic model, a
    dataclass or a TypedDict, making the variable an instance of it (typed.py); `tools` makes the
    output a tool call (tools.py); `n` > 1 samples n outputs (the variable is their list, the
    text continues with the first); `stop_regex` stops where the output first matches a regex."""
    if choices is not None:
        return select(name, choices, temperature=0.0 if temperature is None else temperature, choices_method=choices_method)
    if max_tokens is not None and max_new_tokens is not None and max_tokens != max_new_tokens:
        raise ValueError("gen: max_tokens and max_new_tokens disagree; pass one")
    constraints = [c for c in (dtype, regex, json_schema, ebnf, tools) if c is not None]
    if len(constraints) > 1:
        raise ValueError("gen: pass at most one of dtype, regex, json_schema, ebnf, tools")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"gen: n must be a positive integer, got {n!r}")
    if n is not None and n > 1 and tools is not None:
        raise ValueError("gen: n > 1 with tools is not supported (one tool call per gen)")
    if dtype is not None:
        dtype = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else dtype
        if dtype not in DTYPE_REGEX:
            raise ValueError(f"gen: dtype must be one of int, float, bool, str, got {dtype!r}")
        regex = DTYPE_REGEX[dtype]  # type: ignore[index]
    output_type = None
    if json_schema is not None and is_output_type(json_schema):
        output_type = OutputType.of(json_schema)
        json_schema = output_type.schema
    if json_schema is not None and not isinstance(json_schema, str):
        if not isinstance(json_schema, dict):
            raise TypeError(f"gen: json_schema must be a JSON schema (a dict or JSON text), a pydantic model, a "
                            f"dataclass or a TypedDict, got {json_schema!r}")
        json_schema = json.dumps(json_schema)
    sampling = SamplingArgs(
        max_new_tokens=max_new_tokens if max_new_tokens is not None else max_tokens,
        min_new_tokens=min_tokens,
        n=n,
        stop=stop,
        stop_token_ids=stop_token_ids,
        stop_regex=stop_regex,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos,
        seed=seed,
        regex=regex,
        json_schema=json_schema,
        ebnf=ebnf,
    )
    if tools is not None and not tools:
        raise ValueError("gen: tools is empty")
    return Gen(
        name,
        sampling,
        return_logprob=bool(return_logprob),
        logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num,
        return_text_in_logprobs=bool(return_text_in_logprobs),
        tools=list(tools) if tools is not None else None,
        tool_choice=tool_choice,
        output_type=output_type,
    )


def gen_int(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
            stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
            stop_regex: str | list[str] | None = None, **kwargs: Any) -> Gen | Select:
    """gen constrained to an integer (SGLang's leading arguments, in its order)."""
    return gen(name, max_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids, stop_regex=stop_regex, dtype=int, **kwargs)


def gen_string(name: str | None = None, max_tokens: int | None = None, n: int | None = None,
               stop: str | list[str] | None = None, stop_token_ids: list[int] | None = None,
               stop_regex: str | list[str] | None = None, **kwargs: Any) -> Gen | Select:
    """gen constrained to a double-quoted string (SGLang's leading arguments, in its order)."""
    return gen(name, max_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids, stop_regex=stop_regex, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: Any = TOKEN_LENGTH_NORMALIZED,
) -> Select:
    """Pick one of `choices` by the model's likelihood of each (scored in one batched request).
    `choices_method` is a ChoicesSamplingMethod (`radixlm.greedy_token_selection`, ..., or your
    own) or a built-in method's name."""
    if not choices or not all(isinstance(c, str) for c in choices):
        raise ValueError("select: choices must be a non-empty list of strings")
    method = as_choices_method(choices_method)
    if temperature < 0:
        raise ValueError("select: temperature must be >= 0")
    if temperature > 0 and not isinstance(method, ScoredChoicesMethod):
        raise ValueError(f"select: temperature > 0 samples by a built-in method's scores; {method!r} decides by itself")
    # built-in methods travel by name (what backends and their users compare with)
    return Select(name, list(choices), temperature, method.name if isinstance(method, ScoredChoicesMethod) else method)


def image(source: Any) -> Media:
    """An image in the current message: a file path, an http(s) or data: URL, or bytes. Needs a
    model with vision support (the backend says which it lacks)."""
    return Media("image", _media_source(source, "image"))


def video(path: Any, num_frames: int) -> Media:
    """A video clip in the current message, `num_frames` frames sampled from it (as SGLang).
    Needs a model with vision support."""
    if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
        raise ValueError(f"video: num_frames must be a positive integer, got {num_frames!r}")
    return Media("video", _media_source(path, "video"), num_frames)


def _media_source(source: Any, kind: str) -> str | bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    raise TypeError(f"{kind}: expected a file path, a URL or bytes, got {type(source).__name__}")


def separate_reasoning(expr: Any = None, model_type: str | None = None) -> SeparateReasoning:
    """SGLang's reasoning separation: run `expr` (a gen, a select, or text and roles around
    them), then each variable it sets holds the answer and `{name}_reasoning_content` the
    reasoning, split by `model_type` (a reasoning parser's name: deepseek-r1, qwen3, ...); the
    state's text keeps the answer only. Its gens ask the server to apply their grammar after the
    reasoning (`require_reasoning`, which needs a server started with --reasoning-parser)."""
    if model_type is None:
        raise ValueError(f"separate_reasoning: model_type is required, one of {', '.join(REASONING_PARSERS)}")
    reasoning_format(model_type)  # an unknown name fails here, naming the known ones
    return SeparateReasoning(_requiring_reasoning(as_expr("" if expr is None else expr)), model_type)


def _requiring_reasoning(expr: Expr) -> Expr:
    """`expr` with each of its gens marked `require_reasoning`."""
    if isinstance(expr, Gen):
        return replace(expr, require_reasoning=True)
    if isinstance(expr, Concat):
        return Concat([_requiring_reasoning(part) for part in expr.parts])
    if isinstance(expr, SeparateReasoning):
        return replace(expr, expr=_requiring_reasoning(expr.expr))
    return expr


def generated_names(expr: Expr) -> list[str]:
    """The variables the gens and selects of `expr` set, in order."""
    if isinstance(expr, (Gen, Select)):
        return [] if expr.name is None else [expr.name]
    if isinstance(expr, Concat):
        return [name for part in expr.parts for name in generated_names(part)]
    if isinstance(expr, SeparateReasoning):
        return generated_names(expr.expr)
    return []


def _role(role: str, content: Any) -> Concat:
    parts: list[Expr] = [RoleBegin(role)]
    if content is not None:
        parts.append(as_expr(content))
    parts.append(RoleEnd(role))
    return Concat(parts)


def system(content: Any = None) -> Concat:
    return _role("system", content)


def user(content: Any = None) -> Concat:
    return _role("user", content)


def assistant(content: Any = None) -> Concat:
    return _role("assistant", content)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
