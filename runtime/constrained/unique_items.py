"""`uniqueItems: true` kept at sampling time: no grammar engine enforces it, so the door's rewrite
drops it (`schema_rewrite`) and the request's grammar state is wrapped in a `UniqueItemsState`,
which masks every token that would complete an array item equal to an earlier item of the same
array, wherever the schema as sent says that array's items are unique.

- Which arrays: `UniqueSchema.is_unique(path)` reads the schema as sent along the output's JSON
  path (property names and item indexes), through `$ref`, `allOf` / `anyOf` / `oneOf`,
  `if` / `then` / `else`, dependent schemas and `contains`: an array is kept unique when any
  subschema that may apply to it says so (stricter where a branch that does not apply says so).
- Where: `JsonCursor` follows the output's bytes (strings and escapes, numbers, literals,
  nesting) and knows when an item ends: a string at its closing quote, a number or a literal at
  the byte after it, an object or array at its closing bracket. Items are compared as JSON values
  (`1` and `1.0` equal, key order aside, `true` unlike `1`).
- Which tokens: the ones the grammar allows that hold a byte that could end an item; each is
  fed to a copy of the cursor and masked if an item it completes repeats one. The same check cuts
  speculative drafts and jump-forward text, and `accept_token` refuses a repeating token.
- Items from a finite list (`enum`, `const`, booleans): a token is also masked where, after it,
  the item begun could only become a value the array holds already, or where a new item would
  have to start with none left, so the grammar is not led to a place where every way on repeats.

What is left: elsewhere (a string item with a pattern or a length bound that admits only values
already taken, say) the grammar may leave nothing but a repeat. Then the request ends with an
error that says so (`UniqueItemsDeadEnd`), never with a repeated item.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from radixlm.runtime.constrained.errors import GrammarError
from radixlm.runtime.constrained.json_schema import resolve_pointer

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Path = tuple[str | int, ...]
Domain = tuple[tuple[str, str], ...]  # an item's possible JSON texts, each with its `canonical` key
_WS = frozenset(b" \t\n\r")
_ENDS_SCALAR = frozenset(b",]}") | _WS  # a number or literal ends at the byte after it
_MAX_CANDIDATES = 8192  # tokens checked one by one in a step (beyond: the cheaper byte filter)
_MAX_PATHS = 4096  # paths whose answers a schema caches
_MAX_RANGE = 256  # an integer item's bounds list its values up to this many (then: no lookahead)


class UniqueItemsDeadEnd(ValueError):
    """Every token the grammar allows from here repeats an array item: the request must end."""


def has_unique_items(schema: object) -> bool:
    """True if `uniqueItems: true` appears anywhere in the schema (as a keyword, not in data)."""
    from radixlm.runtime.constrained.compile_cache import walk_subschemas

    return any(node.get("uniqueItems") is True for node, _ in walk_subschemas(schema))


def canonical(value: object) -> str:
    """The text two JSON values share when JSON Schema calls them equal."""
    return json.dumps(_canon(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canon(value: object) -> object:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


class UniqueSchema:
    """The schema as sent, asked per output path whether the array there has unique items and, if
    so, whether its items come from a finite list. Answers are cached per path."""

    def __init__(self, schema: object):
        self.root = schema
        self._unique: dict[Path, bool] = {}
        self._domain: dict[Path, Domain | None] = {}
        self._lock = threading.Lock()

    def is_unique(self, path: Path) -> bool:
        with self._lock:
            known = self._unique.get(path)
        if known is None:
            known = any(n.get("uniqueItems") is True for n in self._at(path))
            with self._lock:
                if len(self._unique) < _MAX_PATHS:
                    self._unique[path] = known
        return known

    def domain(self, path: Path) -> Domain | None:
        """For the items of the array at `path`: every JSON text an item may be, if every
        subschema that applies to an item lists its values (`enum`, `const`, `type: boolean`) and
        they are all scalars; else None."""
        with self._lock:
            if path in self._domain:
                return self._domain[path]
        found = self._item_domain(path)
        with self._lock:
            if len(self._domain) < _MAX_PATHS:
                self._domain[path] = found
        return found

    def _item_domain(self, path: Path) -> Domain | None:
        values: list[object] | None = None
        for node in self._at((*path, 0)):
            listed: list[object] | None = None
            if "const" in node:
                listed = [node["const"]]
            elif isinstance(node.get("enum"), list):
                listed = list(node["enum"])
            elif node.get("type") == "boolean":
                listed = [True, False]
            elif node.get("type") == "integer":
                listed = _small_range(node)
            if listed is None:
                continue
            values = listed if values is None else [v for v in values if any(_equal(v, w) for w in listed)]
        if values is None or any(isinstance(v, (dict, list)) for v in values):
            return None
        texts: list[tuple[str, str]] = []
        for value in values:
            key = canonical(value)
            for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
                if all(text != t for t, _ in texts):
                    texts.append((text, key))
        return tuple(texts)

    def _at(self, path: Path) -> list[dict[str, Any]]:
        """Every subschema that may apply to the value at `path`."""
        nodes = list(self._expand(self.root))
        for step in path:
            next_nodes: list[dict[str, Any]] = []
            for node in nodes:
                for child in _children(node, step):
                    next_nodes.extend(self._expand(child))
            nodes = next_nodes
            if not nodes:
                break
        return nodes

    def _expand(self, schema: object) -> Iterator[dict[str, Any]]:
        """`schema` and every subschema applying to the same value with it (references followed)."""
        seen: set[int] = set()
        stack = [schema]
        while stack:
            node = stack.pop()
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            yield node
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and isinstance(self.root, dict):
                try:
                    stack.append(resolve_pointer(self.root, ref))
                except GrammarError:
                    pass
            for key in ("allOf", "anyOf", "oneOf"):
                if isinstance(node.get(key), list):
                    stack.extend(node[key])
            for key in ("if", "then", "else"):
                stack.append(node.get(key))
            for key in ("dependentSchemas", "dependencies"):
                if isinstance(node.get(key), dict):
                    stack.extend(v for v in node[key].values() if isinstance(v, dict))


def _children(node: dict[str, Any], step: str | int) -> list[object]:
    """The subschemas of `node` for its property `step` (a name) or item `step` (an index)."""
    if isinstance(step, int):
        out: list[object] = []
        prefix = node.get("prefixItems")
        items = node.get("items")
        if isinstance(items, list):  # draft-04 .. 2019-09: items as a list, then additionalItems
            prefix, items = items, node.get("additionalItems")
        if isinstance(prefix, list) and step < len(prefix):
            out.append(prefix[step])
        elif isinstance(items, dict):
            out.append(items)
        elif "unevaluatedItems" in node:
            out.append(node["unevaluatedItems"])
        if isinstance(node.get("contains"), dict):  # the rewrite may ask it of any item
            out.append(node["contains"])
        return out
    out = []
    properties = node.get("properties")
    if isinstance(properties, dict) and step in properties:
        out.append(properties[step])
    matched = False
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        for pattern, sub in patterns.items():
            try:
                if re.search(pattern, step):
                    out.append(sub)
                    matched = True
            except re.error:
                out.append(sub)  # a pattern Python cannot read: assume it applies (stricter)
    if not out and not matched:
        for key in ("additionalProperties", "unevaluatedProperties"):
            if isinstance(node.get(key), dict):
                out.append(node[key])
    return out


def _small_range(node: dict[str, Any]) -> list[object] | None:
    """The integers an integer schema's bounds allow, if at most _MAX_RANGE of them."""
    low, high = node.get("minimum"), node.get("maximum")
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
        low = max(low, node["exclusiveMinimum"] + 1) if isinstance(low, (int, float)) else node["exclusiveMinimum"] + 1
    if isinstance(node.get("exclusiveMaximum"), (int, float)) and not isinstance(node["exclusiveMaximum"], bool):
        high = min(high, node["exclusiveMaximum"] - 1) if isinstance(high, (int, float)) else node["exclusiveMaximum"] - 1
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
        return None
    low, high = math.ceil(low), math.floor(high)
    if high - low + 1 > _MAX_RANGE or "multipleOf" in node:
        return None
    return list(range(low, high + 1))


def _equal(a: object, b: object) -> bool:
    return canonical(a) == canonical(b)


# the cursor: where the output is in its JSON value

_KEY, _COLON, _VALUE, _COMMA = range(4)  # what a container expects next


class _Frame:
    __slots__ = ("is_array", "path", "unique", "seen", "index", "item_start", "key", "expect", "domain")

    def __init__(self, is_array: bool, path: Path, unique: bool, domain: Domain | None):
        self.is_array = is_array
        self.path = path
        self.unique = unique
        self.seen: frozenset[str] = frozenset()
        self.index = 0
        self.item_start = -1
        self.key: str | None = None
        self.expect = _VALUE if is_array else _KEY
        self.domain = domain  # a unique array's possible items (finite lists): (text, key) pairs, else None

    def copy(self) -> _Frame:
        other = _Frame.__new__(_Frame)
        for name in _Frame.__slots__:
            setattr(other, name, getattr(self, name))
        return other


_NONE, _STRING, _SCALAR = range(3)  # the lexical mode


class JsonCursor:
    """Follows a JSON value's bytes; `feed` returns False where an item completed in a unique
    array repeats an earlier one (the cursor is then unusable). `buf` holds every byte fed."""

    def __init__(self, schema: UniqueSchema):
        self.schema = schema
        self.buf = bytearray()
        self.stack: list[_Frame] = []
        self.mode = _NONE
        self.escaped = False
        self.in_key = False
        self.key_start = -1
        self.done = False

    def fork(self) -> JsonCursor:
        """A copy that shares `buf` (feed it, then `restore(len)` the original's length)."""
        other = JsonCursor.__new__(JsonCursor)
        other.schema = self.schema
        other.buf = self.buf
        other.stack = [f.copy() for f in self.stack]
        other.mode, other.escaped, other.in_key = self.mode, self.escaped, self.in_key
        other.key_start, other.done = self.key_start, self.done
        return other

    @property
    def any_unique(self) -> bool:
        return any(f.unique for f in self.stack)

    def feed(self, data: bytes) -> bool:
        for byte in data:
            if not self._byte(byte):
                return False
        return True

    def viable(self) -> bool:
        """False where a unique array of listed values can only repeat: its item begun is a prefix
        of taken values only, or a new item must start with none left."""
        for frame in self.stack:
            if not (frame.unique and frame.domain is not None):
                continue
            free = [text for text, key in frame.domain if key not in frame.seen]
            if frame.item_start >= 0:
                begun = bytes(self.buf[frame.item_start:]).decode("utf-8", "replace")
                if not any(t.startswith(begun) for t in free):
                    return False
            elif frame.expect == _VALUE and frame.index > 0 and not free:
                return False
        return True

    def _byte(self, byte: int) -> bool:
        pos = len(self.buf)
        self.buf.append(byte)
        if self.mode == _STRING:
            if self.escaped:
                self.escaped = False
            elif byte == 0x5C:  # backslash
                self.escaped = True
            elif byte == 0x22:  # the closing quote
                self.mode = _NONE
                if self.in_key:
                    top = self.stack[-1]
                    try:
                        top.key = json.loads(bytes(self.buf[self.key_start:pos + 1]))
                    except ValueError:
                        top.key = None
                    top.expect = _COLON
                else:
                    return self._value_done(pos + 1)
            return True
        if self.mode == _SCALAR:
            if byte not in _ENDS_SCALAR:
                return True
            self.mode = _NONE
            if not self._value_done(pos):
                return False
        return self._structural(byte, pos)

    def _structural(self, byte: int, pos: int) -> bool:
        if byte in _WS:
            return True
        top = self.stack[-1] if self.stack else None
        if byte == 0x22:  # "
            self.mode, self.escaped = _STRING, False
            if top is not None and not top.is_array and top.expect == _KEY:
                self.in_key, self.key_start = True, pos
            else:
                self.in_key = False
                self._value_start(pos)
        elif byte in (0x5B, 0x7B):  # [ {
            self._value_start(pos)
            path: Path = () if top is None else (*top.path, top.index if top.is_array else (top.key or ""))
            is_array = byte == 0x5B
            unique = is_array and self.schema.is_unique(path)
            self.stack.append(_Frame(is_array, path, unique, self.schema.domain(path) if unique else None))
        elif byte in (0x5D, 0x7D):  # ] }
            if self.stack:
                self.stack.pop()
            return self._value_done(pos + 1)
        elif byte == 0x3A:  # :
            if top is not None:
                top.expect = _VALUE
        elif byte == 0x2C:  # ,
            if top is not None:
                top.expect = _VALUE if top.is_array else _KEY
        else:  # a number or a literal begins
            self.mode = _SCALAR
            self._value_start(pos)
        return True

    def _value_start(self, pos: int) -> None:
        if self.stack and self.stack[-1].is_array:
            self.stack[-1].item_start = pos

    def _value_done(self, end: int) -> bool:
        if not self.stack:
            self.done = True
            return True
        top = self.stack[-1]
        top.expect = _COMMA
        if not top.is_array:
            return True
        if top.unique:
            try:
                key = canonical(json.loads(bytes(self.buf[top.item_start:end])))
            except ValueError:
                key = bytes(self.buf[top.item_start:end]).decode("utf-8", "replace")
            if key in top.seen:
                return False
            top.seen = top.seen | {key}
        top.index += 1
        top.item_start = -1
        return True


# the vocabulary's byte classes, once per vocabulary

class _Classes:
    def __init__(self, id_to_bytes: Mapping[int, bytes], vocab_size: int):
        self.token_bytes: list[bytes | None] = [None] * vocab_size
        quote = np.zeros(vocab_size, dtype=bool)
        ends = np.zeros(vocab_size, dtype=bool)  # a byte that may end an item of any kind
        opens = np.zeros(vocab_size, dtype=bool)
        self.ids_of: dict[bytes, list[int]] = {}
        for token_id, data in id_to_bytes.items():
            if token_id >= vocab_size or not data:
                continue
            self.token_bytes[token_id] = data
            self.ids_of.setdefault(data, []).append(token_id)
            has = set(data)
            quote[token_id] = 0x22 in has
            ends[token_id] = bool(has & (_ENDS_SCALAR | {0x22}))
            opens[token_id] = 0x5B in has
        self.quote, self.ends = quote, ends
        self.opens_and_ends = opens & ends


# per vocabulary (its id -> bytes map, kept alive here) and logits width; a process has one or two
_CLASSES: dict[tuple[int, int], tuple[Mapping[int, bytes], _Classes]] = {}
_CLASSES_LOCK = threading.Lock()


def _classes(id_to_bytes: Mapping[int, bytes], vocab_size: int) -> _Classes:
    with _CLASSES_LOCK:
        found = _CLASSES.get((id(id_to_bytes), vocab_size))
        if found is None or found[0] is not id_to_bytes:
            found = _CLASSES[(id(id_to_bytes), vocab_size)] = (id_to_bytes, _Classes(id_to_bytes, vocab_size))
        return found[1]


class UniqueItemsState:
    """A grammar state (any backend's) with its JSON output's unique arrays kept unique. It
    answers as the inner state does, with the tokens that would repeat an item masked."""

    def __init__(self, inner: Any, schema: UniqueSchema, classes: _Classes):
        self.inner = inner
        self.schema = schema
        self.classes = classes
        self.cursor = JsonCursor(schema)

    def __getattr__(self, name: str) -> Any:  # closing plans, budgets, compiled facts: the inner state's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def copy(self) -> UniqueItemsState:
        return UniqueItemsState(self.inner.copy(), self.schema, self.classes)

    def accept_token(self, token_id: int) -> None:
        data = self._bytes(token_id)
        if data:
            probe = self.cursor.fork()
            length = len(self.cursor.buf)
            ok = probe.feed(data)
            del self.cursor.buf[length:]
            if not ok:
                raise UniqueItemsDeadEnd(
                    "uniqueItems: every token the grammar allowed here repeats an earlier item of the array "
                    f"at {_pointer(probe)}, so the output cannot go on without breaking the schema")
        self.inner.accept_token(token_id)
        if data:
            self.cursor.feed(data)

    def fill_vocab_mask(self, mask_row: torch.Tensor, *args: Any) -> Any:
        result = self.inner.fill_vocab_mask(mask_row, *args)
        length = len(self.cursor.buf)
        try:
            self._mask(self.cursor.fork(), mask_row, [])
        finally:
            del self.cursor.buf[length:]
        return result

    def fill_vocab_masks(self, mask_rows: torch.Tensor, draft: list[int], budget: int | None = None) -> bool:
        steered = bool(self.inner.fill_vocab_masks(mask_rows, draft, budget))
        cursor, length = self.cursor.fork(), len(self.cursor.buf)
        try:
            for j in range(len(draft) + 1):
                self._mask(cursor, mask_rows[j], draft[:j])
                if j < len(draft) and not self._advance(cursor, draft[j]):
                    break  # row j refuses draft[j]: the rows after it are never sampled from
        finally:
            del self.cursor.buf[length:]
        return steered

    def valid_prefix_len(self, tokens: list[int]) -> int:
        return self._cut(tokens[: self.inner.valid_prefix_len(tokens)])

    def jump_forward_ids(self, last_token_id: int, max_tokens: int) -> list[int]:
        forced = self.inner.jump_forward_ids(last_token_id, max_tokens)
        return forced[: self._cut(forced)]

    def _cut(self, tokens: list[int]) -> int:
        """How many leading `tokens` neither repeat an item nor lead where only repeats are left."""
        cursor, length = self.cursor.fork(), len(self.cursor.buf)
        try:
            for i, token_id in enumerate(tokens):
                if not self._advance(cursor, token_id):
                    return i
            return len(tokens)
        finally:
            del self.cursor.buf[length:]

    def _advance(self, cursor: JsonCursor, token_id: int) -> bool:
        data = self._bytes(token_id)
        return not data or (cursor.feed(data) and cursor.viable())

    def _bytes(self, token_id: int) -> bytes | None:
        table = self.classes.token_bytes
        return table[token_id] if 0 <= token_id < len(table) else None

    def _mask(self, cursor: JsonCursor, row: torch.Tensor, draft: list[int]) -> None:
        """Clears the allowed tokens of `row` that would repeat an item from `cursor`'s place (the
        inner state's after `draft`), lead where only repeats are left, or spell an item that
        repeats one unless the grammar lets it go on (one token of lookahead: a number or string
        item as long as one taken, say). A row it would empty is left as the grammar gave it (the
        sampled token then ends the request: `accept_token`)."""
        if cursor.done:
            return
        try:
            self._mask_or_raise(cursor, row, draft)
        except Exception:  # a bug here must not stop the server: the request's accept_token still checks
            logger.exception("uniqueItems: the mask check failed; the row is left as the grammar gave it")

    def _mask_or_raise(self, cursor: JsonCursor, row: torch.Tensor, draft: list[int]) -> None:
        allowed = row.numpy()
        classes = self.classes
        size = min(allowed.size, len(classes.token_bytes))
        top = cursor.stack[-1] if cursor.stack else None
        listed = top is not None and top.unique and top.domain is not None
        if not cursor.any_unique:
            candidates = np.flatnonzero(allowed[:size] & classes.opens_and_ends[:size])
        elif listed:
            candidates = np.flatnonzero(allowed[:size])
        else:
            byte_class = classes.quote if cursor.mode == _STRING else classes.ends
            candidates = np.flatnonzero(allowed[:size] & byte_class[:size])
        if listed and candidates.size > _MAX_CANDIDATES:
            candidates = np.flatnonzero(allowed[:size] & classes.ends[:size])
        banned = [t for t in candidates.tolist() if not self._fits(cursor, t)]
        if top is not None and top.unique and not listed:
            banned_set = set(banned)
            for token_id in self._spelling_taken(cursor, top):
                if token_id < size and allowed[token_id] and token_id not in banned_set and (
                        not self._goes_on(cursor, draft, token_id)):
                    banned.append(token_id)
        if banned and len(banned) < int(allowed.sum()):
            allowed[banned] = False

    def _fits(self, cursor: JsonCursor, token_id: int) -> bool:
        """Whether the token, after `cursor`, repeats no item and leaves a listed value to take."""
        data = self.classes.token_bytes[token_id]
        if not data:
            return True
        length = len(cursor.buf)
        try:
            probe = cursor.fork()
            return probe.feed(data) and probe.viable()
        finally:
            del cursor.buf[length:]

    def _spelling_taken(self, cursor: JsonCursor, frame: _Frame) -> list[int]:
        """The tokens after which the scalar item begun in `frame` (the innermost array) is one
        the array holds, but for its end (a string's closing quote, a number's next byte)."""
        if frame.item_start < 0 and frame.expect != _VALUE or cursor.mode not in (_NONE, _STRING, _SCALAR):
            return []
        begun = bytes(cursor.buf[frame.item_start:]) if frame.item_start >= 0 else b""
        if cursor.mode == _STRING and cursor.escaped:
            return []
        ids: list[int] = []
        for key in frame.seen:
            if key[:1] in "[{":
                continue
            body = (key[:-1] if key.startswith('"') else key).encode("utf-8", "surrogatepass")
            if begun:
                rests = [body[len(begun):]] if body.startswith(begun) and len(body) > len(begun) else []
            else:
                rests = [body, b" " + body]
            for rest in rests:
                ids.extend(self.classes.ids_of.get(rest, ()))
        return ids

    def _goes_on(self, cursor: JsonCursor, draft: list[int], token_id: int) -> bool:
        """Whether, after `token_id`, the grammar (the inner state after `draft`) allows a token
        that does not complete a repeat."""
        import torch

        rows = torch.zeros(len(draft) + 2, len(self.classes.token_bytes), dtype=torch.bool)
        try:
            self.inner.fill_vocab_masks(rows, [*draft, token_id])
        except ValueError:
            return False
        data = self.classes.token_bytes[token_id] or b""
        length = len(cursor.buf)
        try:
            probe = cursor.fork()
            if not probe.feed(data):
                return False
            after = rows[-1].numpy()
            ending = self.classes.quote if probe.mode == _STRING else self.classes.ends
            if (after & ~ending).any():
                return True  # a token that ends nothing
            return any(self._fits(probe, u) for u in np.flatnonzero(after).tolist())
        finally:
            del cursor.buf[length:]


def _pointer(cursor: JsonCursor) -> str:
    frames = [f for f in cursor.stack if f.unique]
    path = frames[-1].path if frames else ()
    return "#" + "".join(f"/{p}" for p in path)


_SCHEMAS: dict[str, UniqueSchema] = {}
_SCHEMAS_LOCK = threading.Lock()


def _schema(schema_text: str) -> UniqueSchema:
    """The schema (its JSON text, as sent), shared with its path answers by the requests that send it."""
    with _SCHEMAS_LOCK:
        schema = _SCHEMAS.get(schema_text)
        if schema is None:
            if len(_SCHEMAS) >= 64:
                _SCHEMAS.pop(next(iter(_SCHEMAS)))
            schema = _SCHEMAS[schema_text] = UniqueSchema(json.loads(schema_text))
        return schema


def wrap(inner: Any, schema_text: str, id_to_bytes: Mapping[int, bytes], vocab_size: int) -> UniqueItemsState:
    """`inner` (a new grammar state) with the unique arrays of the schema kept unique."""
    return UniqueItemsState(inner, _schema(schema_text), _classes(id_to_bytes, vocab_size))


def keeps_unique(schema_text: str, text: str) -> bool:
    """Whether the JSON `text` repeats no item of an array the schema says is unique (what the
    state lets through, for a whole text)."""
    return JsonCursor(_schema(schema_text)).feed(text.encode())
