"""A corpus of real-world-style JSON Schemas (Draft 2020-12) for measuring grammar-engine coverage:
the share of schemas a backend compiles and whose outputs validate. Written for this project (no
schema or text copied from elsewhere); each entry carries a small `example` proving it satisfiable.

Quotas, each counted by `features` (a schema may count for several): at least 20 schemas with a
recursive `$ref` (`#`, `$defs`, `definitions`; at least 5 by mutual recursion), 20 with `pattern`,
20 with `format`, 20 with `anyOf`/`oneOf`, 20 with bounded arrays (`minItems`/`maxItems`) and 10
wide objects (50+ properties); the rest are plain objects (enums, consts, nested objects, numeric
bounds, nullable types, closed objects, string lengths) over varied domains.

So that a tiny model can finish under a modest token budget: recursion is always optional (the
recursive fields are never required, recursive arrays accept 0 items), `minItems` is at most 3,
the wide objects require at most 5 fields, and patterns are simple regexes (no lookaround or
backreference).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard
from urllib.parse import unquote

Schema = dict[str, Any]
_Entry = tuple[str, Schema, object]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

# The formats the corpus uses: the ones `jsonschema.FormatChecker()` really checks in this venv
# (jsonschema 4.26). Verified by listing `FormatChecker().checkers` (date, email, idn-email,
# idn-hostname, ipv4, ipv6, regex, time, uuid: `date-time`, `uri` and `hostname` are absent, their
# optional packages not installed, so any string passes) and by a wrong value failing each one
# (tests/runtime/test_schema_corpus.py). `time` is left out: without rfc3339-validator the only
# `time` checker is Draft 3's `%H:%M:%S`, which rejects RFC 3339 times such as "09:30:00Z".
# (`email` only checks for an "@".)
CHECKED_FORMATS = ("date", "email", "ipv4", "ipv6", "uuid")


@dataclass(frozen=True)
class CorpusSchema:
    name: str
    schema: Schema
    example: object


def corpus() -> list[CorpusSchema]:
    """Every schema of the corpus, in a fixed order, built afresh as plain JSON (no two parts share an
    object, so callers may mutate them)."""
    sections = (_plain, _patterns, _formats, _unions, _bounded_arrays, _recursive, _wide)
    return [CorpusSchema(name, json.loads(json.dumps({"$schema": DIALECT, **schema})), example)
            for section in sections for name, schema, example in section()]


# --- features -----------------------------------------------------------------------------------

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})
_DEFINITIONS = frozenset({"$defs", "definitions"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_VALUES = frozenset({"items", "additionalItems", "additionalProperties", "unevaluatedItems",
                            "unevaluatedProperties", "contains", "propertyNames", "not", "if", "then",
                            "else"})


def features(schema: Schema) -> set[str]:
    """Which of ref_recursive, pattern, format, union, array_bounds, wide the schema uses."""
    found: set[str] = set()
    for sub in _subschemas(schema):
        if "pattern" in sub:
            found.add("pattern")
        if "format" in sub:
            found.add("format")
        if "anyOf" in sub or "oneOf" in sub:
            found.add("union")
        if "minItems" in sub or "maxItems" in sub:
            found.add("array_bounds")
        if isinstance(sub.get("properties"), dict) and len(sub["properties"]) >= 50:
            found.add("wide")
        ref = sub.get("$ref")
        if _is_pointer(ref) and (ref == "#" or _reaches_itself(schema, ref)):
            found.add("ref_recursive")
    return found


def _subschemas(schema: object, *, definitions: bool = True) -> Iterator[Schema]:
    """`schema` and every schema in it, by keyword (a property named `pattern` is not the keyword);
    without `definitions`, `$defs`/`definitions` bodies are skipped: only a `$ref` enters them."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key, value in schema.items():
        if key in _SCHEMA_MAPS or (definitions and key in _DEFINITIONS):
            children = list(value.values())
        elif key in _SCHEMA_LISTS or (key == "items" and isinstance(value, list)):
            children = value
        elif key in _SCHEMA_VALUES:
            children = [value]
        else:
            continue
        for child in children:
            yield from _subschemas(child, definitions=definitions)


def _is_pointer(ref: object) -> TypeGuard[str]:
    """A local `$ref` by JSON pointer: `#` or `#/...` (not an anchor, not another document)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _resolve(root: Schema, ref: str) -> object:
    """What a local `$ref` (a JSON pointer after `#`) points at; None when it points nowhere."""
    node: Any = root
    for token in ref.removeprefix("#").split("/")[1:]:
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


def _reaches_itself(root: Schema, target: str) -> bool:
    """Whether the schema at `target` leads back to `target` through local `$ref`s."""
    seen, stack = {target}, [target]
    while stack:
        for sub in _subschemas(_resolve(root, stack.pop()), definitions=False):
            ref = sub.get("$ref")
            if ref == target:
                return True
            if _is_pointer(ref) and ref not in seen:
                seen.add(ref)
                stack.append(ref)
    return False


# --- building blocks ----------------------------------------------------------------------------

def _obj(properties: Schema, required: tuple[str, ...] | list[str] = (), *, closed: bool = False,
         **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema | extra


def _s(**constraints: Any) -> Schema:
    return {"type": "string", **constraints}


def _i(minimum: int | None = None, maximum: int | None = None) -> Schema:
    return _bounded("integer", minimum, maximum)


def _n(minimum: float | None = None, maximum: float | None = None) -> Schema:
    return _bounded("number", minimum, maximum)


def _bounded(type_: str, minimum: float | None, maximum: float | None) -> Schema:
    schema: Schema = {"type": type_}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _b() -> Schema:
    return {"type": "boolean"}


def _e(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def _a(items: Schema, min_items: int | None = None, max_items: int | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "array", "items": items}
    if min_items is not None:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema | extra


def _null(type_: str, **constraints: Any) -> Schema:
    return {"type": [type_, "null"], **constraints}


def _f(name: str) -> Schema:
    return {"type": "string", "format": name}


def _p(regex: str) -> Schema:
    return {"type": "string", "pattern": regex}


def _const(value: object) -> Schema:
    return {"const": value}


def _ref(target: str) -> Schema:
    return {"$ref": target}


def _nullable_ref(target: str) -> Schema:
    return {"anyOf": [_ref(target), {"type": "null"}]}


# --- plain objects ------------------------------------------------------------------------------

def _plain() -> list[_Entry]:
    line_item = _obj({"sku": _s(), "quantity": _i(1), "unit_price": _n(0)}, ("sku", "quantity", "unit_price"),
                     closed=True)
    ingredient = _obj({"name": _s(), "amount": _n(0),
                       "unit": _e("g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece")},
                      ("name",))
    return [
        ("user_profile_basic",
         _obj({"username": _s(minLength=3, maxLength=20), "display_name": _s(maxLength=50),
               "age": _i(13, 130), "is_verified": _b(), "bio": _null("string", maxLength=280)},
              ("username", "display_name"), closed=True),
         {"username": "ana", "display_name": "Ana"}),
        ("order_with_line_items",
         _obj({"order_id": _s(), "customer_id": _s(),
               "status": _e("pending", "paid", "shipped", "delivered", "cancelled"), "items": _a(line_item),
               "total": _n(0), "currency": _const("USD")}, ("order_id", "items", "total"), closed=True),
         {"order_id": "A1", "items": [], "total": 0}),
        ("invoice_summary",
         _obj({"invoice_number": _s(maxLength=20), "issued_on": _s(), "due_in_days": _i(0, 120),
               "subtotal": _n(0), "tax_rate": _n(0, 1), "total": _n(0), "paid": _b(),
               "notes": _null("string")},
              ("invoice_number", "total", "paid")),
         {"invoice_number": "INV-1", "total": 10.5, "paid": False}),
        ("recipe_card",
         _obj({"title": _s(maxLength=80), "servings": _i(1, 50), "prep_minutes": _i(0, 600),
               "cook_minutes": _i(0, 1440), "difficulty": _e("easy", "medium", "hard"), "vegetarian": _b(),
               "ingredients": _a(ingredient), "steps": _a(_s(maxLength=300))}, ("title", "servings")),
         {"title": "Toast", "servings": 1}),
        ("calendar_event_simple",
         _obj({"title": _s(), "start": _s(), "end": _s(), "all_day": _b(), "location": _null("string"),
               "attendees": _a(_s()), "visibility": _e("public", "private", "confidential")},
              ("title", "start"), closed=True),
         {"title": "Standup", "start": "09:00"}),
        ("github_issue_summary",
         _obj({"number": _i(1), "title": _s(minLength=1, maxLength=256), "state": _e("open", "closed"),
               "labels": _a(_s()), "assignee": _null("string"), "comments": _i(0), "locked": _b()},
              ("number", "title", "state")),
         {"number": 42, "title": "Crash on start", "state": "open"}),
        ("log_record",
         _obj({"level": _e("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), "message": _s(), "logger": _s(),
               "line": _i(1), "timestamp_ms": _i(0),
               "context": {"type": "object", "additionalProperties": _s()}},
              ("level", "message")),
         {"level": "INFO", "message": "started"}),
        ("sensor_reading",
         _obj({"sensor_id": _s(), "kind": _e("temperature", "humidity", "pressure"), "value": _n(),
               "unit": _e("celsius", "percent", "hpa"), "battery_pct": _i(0, 100), "ok": _b()},
              ("sensor_id", "kind", "value"), closed=True),
         {"sensor_id": "s1", "kind": "humidity", "value": 41.5}),
        ("api_error_body",
         _obj({"error": _obj({"code": _i(400, 599), "message": _s(), "details": _null("string")},
                             ("code", "message"), closed=True)}, ("error",), closed=True),
         {"error": {"code": 404, "message": "not found"}}),
        ("jsonrpc_notification",
         _obj({"jsonrpc": _const("2.0"), "method": _s(minLength=1), "params": {"type": "object"}},
              ("jsonrpc", "method"), closed=True),
         {"jsonrpc": "2.0", "method": "ping"}),
        ("app_config_file",
         _obj({"server": _obj({"host": _s(), "port": _i(1, 65535)}, ("host", "port"), closed=True),
               "debug": _b(), "log_level": _e("debug", "info", "warn", "error"), "workers": _i(1, 64),
               "features": {"type": "object", "additionalProperties": _b()}}, ("server",)),
         {"server": {"host": "localhost", "port": 8080}}),
        ("product_catalog_entry",
         _obj({"sku": _s(), "name": _s(maxLength=120), "price": {"type": "number", "exclusiveMinimum": 0},
               "in_stock": _b(), "category": _e("books", "electronics", "garden", "toys", "clothing"),
               "tags": _a(_s()), "dimensions_cm": _obj({"width": _n(0), "height": _n(0), "depth": _n(0)})},
              ("sku", "name", "price")),
         {"sku": "B-1", "name": "Lamp", "price": 19.99}),
        ("shipping_address",
         _obj({"recipient": _s(), "line1": _s(), "line2": _null("string"), "city": _s(), "region": _s(),
               "postal_code": _s(maxLength=12), "country_code": _s(minLength=2, maxLength=2)},
              ("recipient", "line1", "city", "country_code"), closed=True),
         {"recipient": "Lea", "line1": "1 Main St", "city": "Oslo", "country_code": "NO"}),
        ("bank_transfer_request",
         _obj({"amount": _n(0.01), "currency": _e("EUR", "USD", "GBP", "JPY"), "from_account": _s(),
               "to_account": _s(), "reference": _s(maxLength=140), "instant": _b()},
              ("amount", "currency", "from_account", "to_account")),
         {"amount": 5, "currency": "EUR", "from_account": "a", "to_account": "b"}),
        ("weather_forecast_day",
         _obj({"day": _s(), "high_c": _n(-90, 60), "low_c": _n(-90, 60),
               "condition": _e("sunny", "cloudy", "rain", "snow", "storm", "fog"),
               "precipitation_chance": _i(0, 100), "wind_kph": _n(0)}, ("day", "condition")),
         {"day": "Monday", "condition": "rain"}),
        ("movie_review",
         _obj({"movie_title": _s(), "rating": _i(1, 5), "recommend": _b(), "review_text": _s(maxLength=1000),
               "contains_spoilers": _b()}, ("movie_title", "rating"), closed=True),
         {"movie_title": "Heat", "rating": 5}),
        ("job_posting",
         _obj({"title": _s(), "company": _s(), "remote": _b(), "salary_min": _i(0), "salary_max": _i(0),
               "employment_type": _e("full_time", "part_time", "contract", "internship"),
               "seniority": _e("junior", "mid", "senior", "lead")}, ("title", "company", "employment_type")),
         {"title": "Baker", "company": "Crumbs", "employment_type": "part_time"}),
        ("book_record",
         _obj({"title": _s(), "authors": _a(_s()), "year": _i(1450, 2100), "isbn": _s(), "pages": _i(1),
               "language": _e("en", "fr", "de", "es", "it", "ja", "zh")}, ("title", "authors")),
         {"title": "Dune", "authors": []}),
        ("flight_booking",
         _obj({"passenger": _obj({"first_name": _s(), "last_name": _s()}, ("first_name", "last_name"),
                                 closed=True),
               "flight_number": _s(maxLength=8), "seat": _null("string", maxLength=4),
               "cabin": _e("economy", "premium_economy", "business", "first"), "checked_bags": _i(0, 5)},
              ("passenger", "flight_number", "cabin"), closed=True),
         {"passenger": {"first_name": "Jo", "last_name": "Ng"}, "flight_number": "LH400",
          "cabin": "economy"}),
        ("hotel_reservation",
         _obj({"hotel_name": _s(), "nights": _i(1, 30), "guests": _i(1, 8), "breakfast_included": _b(),
               "room_type": _e("single", "double", "twin", "suite"), "special_requests": _null("string")},
              ("hotel_name", "nights", "guests")),
         {"hotel_name": "Bay Inn", "nights": 2, "guests": 2}),
        ("support_ticket",
         _obj({"id": _i(1), "subject": _s(maxLength=200), "priority": _e("low", "normal", "high", "urgent"),
               "status": _e("new", "open", "pending", "solved", "closed"), "customer_email": _s(),
               "message_count": _i(0)}, ("id", "subject", "priority", "status")),
         {"id": 7, "subject": "Refund", "priority": "normal", "status": "new"}),
        ("chat_message",
         _obj({"role": _e("system", "user", "assistant", "tool"), "content": _s(), "name": _s(maxLength=64)},
              ("role", "content"), closed=True),
         {"role": "user", "content": "hello"}),
        ("http_request_log",
         _obj({"method": _e("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"), "path": _s(),
               "status": _i(100, 599), "duration_ms": _n(0), "bytes_sent": _i(0),
               "user_agent": _null("string")},
              ("method", "path", "status")),
         {"method": "GET", "path": "/", "status": 200}),
        ("container_deployment_spec",
         _obj({"name": _s(), "image": _s(), "replicas": _i(0, 100), "cpu_millicores": _i(1, 64000),
               "memory_mb": _i(16), "env": {"type": "object", "additionalProperties": _s()},
               "restart_policy": _e("Always", "OnFailure", "Never")}, ("name", "image")),
         {"name": "web", "image": "nginx"}),
        ("database_connection_config",
         _obj({"driver": _e("postgres", "mysql", "sqlite"), "host": _s(), "port": _i(1, 65535),
               "database": _s(), "user": _s(), "password": _null("string"), "pool_size": _i(1, 100),
               "ssl": _b()},
              ("driver", "database"), closed=True),
         {"driver": "sqlite", "database": "app.db"}),
        ("feature_flag_toggle",
         _obj({"key": _s(), "enabled": _b(), "rollout_percent": _i(0, 100), "description": _null("string"),
               "owner": _s()}, ("key", "enabled")),
         {"key": "new_ui", "enabled": True}),
        ("payment_card_tokenized",
         _obj({"token": _s(), "brand": _e("visa", "mastercard", "amex", "discover"),
               "last4": _s(minLength=4, maxLength=4), "exp_month": _i(1, 12), "exp_year": _i(2024, 2050)},
              ("token", "brand", "last4"), closed=True),
         {"token": "tok_1", "brand": "visa", "last4": "4242"}),
        ("nutrition_facts_label",
         _obj({"serving_size_g": _n(0), "calories": _i(0, 5000), "fat_g": _n(0), "carbohydrate_g": _n(0),
               "protein_g": _n(0), "sodium_mg": _n(0), "contains_allergens": _b()},
              ("serving_size_g", "calories")),
         {"serving_size_g": 30, "calories": 120}),
        ("employee_directory_entry",
         _obj({"employee_id": _i(1), "name": _s(),
               "department": _e("engineering", "sales", "finance", "hr", "legal"),
               "manager_id": _null("integer"), "full_time": _b(), "salary": _n(0)},
              ("employee_id", "name", "department")),
         {"employee_id": 3, "name": "Sam", "department": "sales"}),
        ("todo_item",
         _obj({"title": _s(minLength=1), "done": _b(), "priority": _i(1, 4), "due": _null("string"),
               "tags": _a(_s())}, ("title", "done"), closed=True),
         {"title": "Buy milk", "done": False}),
        ("poll_vote",
         _obj({"poll_id": _s(), "option_index": _i(0, 9), "anonymous": _b()}, ("poll_id", "option_index"),
              closed=True),
         {"poll_id": "p1", "option_index": 2}),
        ("music_track",
         _obj({"title": _s(), "artist": _s(), "album": _null("string"), "duration_seconds": _i(1, 7200),
               "explicit": _b(),
               "genre": _e("rock", "pop", "jazz", "classical", "hiphop", "electronic", "folk")},
              ("title", "artist")),
         {"title": "Song", "artist": "Band"}),
        ("vehicle_listing",
         _obj({"make": _s(), "model": _s(), "year": _i(1950, 2030), "mileage_km": _i(0),
               "fuel": _e("petrol", "diesel", "electric", "hybrid"), "price": _n(0),
               "transmission": _e("manual", "automatic")}, ("make", "model", "year")),
         {"make": "Volvo", "model": "240", "year": 1990}),
        ("real_estate_listing",
         _obj({"address": _obj({"street": _s(), "city": _s(), "postal_code": _s()}, ("street", "city")),
               "bedrooms": _i(0, 20),
               "bathrooms": {"type": "number", "minimum": 0, "maximum": 20, "multipleOf": 0.5},
               "area_sqm": _n(0), "for_sale": _b(), "price": _n(0)}, ("address", "for_sale")),
         {"address": {"street": "Elm 2", "city": "Bern"}, "for_sale": True}),
        ("ml_training_run_summary",
         _obj({"run_name": _s(), "model": _e("linear", "mlp", "cnn", "transformer"),
               "learning_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
               "epochs": _i(1, 1000), "accuracy": _n(0, 1), "converged": _b()}, ("run_name", "model")),
         {"run_name": "r1", "model": "mlp"}),
        ("translation_request",
         _obj({"source_lang": _e("auto", "en", "fr", "de", "es"), "target_lang": _e("en", "fr", "de", "es"),
               "text": _s(minLength=1, maxLength=5000), "formality": _e("default", "formal", "informal")},
              ("target_lang", "text"), closed=True),
         {"target_lang": "fr", "text": "hello"}),
        ("git_commit_summary",
         _obj({"sha": _s(minLength=7, maxLength=40), "author": _s(), "message": _s(), "files_changed": _i(0),
               "insertions": _i(0), "deletions": _i(0), "is_merge": _b()}, ("sha", "message")),
         {"sha": "abc1234", "message": "fix"}),
        ("ci_pipeline_status",
         _obj({"pipeline": _s(), "branch": _s(),
               "status": _e("queued", "running", "passed", "failed", "cancelled"),
               "duration_s": _null("integer", minimum=0), "triggered_by": _e("push", "schedule", "manual")},
              ("pipeline", "status")),
         {"pipeline": "build", "status": "passed"}),
        ("sports_match_result",
         _obj({"home_team": _s(), "away_team": _s(), "home_score": _i(0), "away_score": _i(0),
               "finished": _b(), "venue": _null("string")},
              ("home_team", "away_team", "home_score", "away_score")),
         {"home_team": "A", "away_team": "B", "home_score": 1, "away_score": 0}),
        ("restaurant_menu_item",
         _obj({"name": _s(), "price": _n(0), "spicy_level": _i(0, 3), "vegan": _b(), "gluten_free": _b(),
               "course": _e("starter", "main", "dessert", "drink")}, ("name", "price", "course"),
              closed=True),
         {"name": "Soup", "price": 6.5, "course": "starter"}),
        ("inventory_adjustment",
         _obj({"sku": _s(), "warehouse": _e("north", "south", "east", "west"), "delta": _i(-10000, 10000),
               "reason": _e("received", "sold", "damaged", "returned", "correction"),
               "note": _null("string")},
              ("sku", "warehouse", "delta", "reason")),
         {"sku": "X", "warehouse": "east", "delta": -2, "reason": "sold"}),
        ("stock_quote_snapshot",
         _obj({"symbol": _s(minLength=1, maxLength=5), "price": _n(0), "change": _n(), "change_pct": _n(),
               "volume": _i(0), "market_open": _b()}, ("symbol", "price")),
         {"symbol": "ACME", "price": 12.3}),
        ("medication_dose_schedule",
         _obj({"drug_name": _s(), "dose_mg": {"type": "number", "exclusiveMinimum": 0},
               "frequency": _e("once_daily", "twice_daily", "three_times_daily", "weekly", "as_needed"),
               "with_food": _b(), "duration_days": _i(1, 365)}, ("drug_name", "dose_mg", "frequency")),
         {"drug_name": "ibuprofen", "dose_mg": 200, "frequency": "as_needed"}),
        ("device_heartbeat",
         _obj({"device_id": _s(), "firmware_version": _s(), "uptime_s": _i(0), "online": _b(),
               "temperature_c": _null("number")}, ("device_id", "online"), closed=True),
         {"device_id": "d9", "online": True}),
        ("email_message_envelope",
         _obj({"subject": _s(maxLength=255), "sender": _s(), "to": _a(_s()), "cc": _a(_s()),
               "has_attachments": _b(), "importance": _e("low", "normal", "high")},
              ("subject", "sender", "to")),
         {"subject": "Hi", "sender": "me", "to": []}),
        ("course_enrollment",
         _obj({"student_id": _s(), "course_code": _s(), "term": _e("spring", "summer", "fall", "winter"),
               "credits": _i(1, 6), "audit": _b(),
               "grade": {"type": ["string", "null"], "enum": ["A", "B", "C", "D", "F", None]}},
              ("student_id", "course_code", "term")),
         {"student_id": "s1", "course_code": "CS101", "term": "fall"}),
        ("houseplant_care_schedule",
         _obj({"species": _s(), "water_every_days": _i(1, 60), "sunlight": _e("full_sun", "partial", "shade"),
               "fertilize_monthly": _b(), "indoor": _b()}, ("species", "water_every_days")),
         {"species": "Ficus", "water_every_days": 7}),
        ("parking_session",
         _obj({"zone": _s(), "plate": _s(), "duration_minutes": _i(1, 1440), "paid": _b(), "amount": _n(0)},
              ("zone", "plate", "duration_minutes"), closed=True),
         {"zone": "Z4", "plate": "AB123", "duration_minutes": 30}),
        ("likert_survey_answer",
         _obj({"question_id": _s(),
               "answer": _e("strongly_disagree", "disagree", "neutral", "agree", "strongly_agree"),
               "comment": _null("string", maxLength=500)}, ("question_id", "answer")),
         {"question_id": "q1", "answer": "agree"}),
        ("npm_package_manifest",
         _obj({"name": _s(), "version": _s(), "description": _s(), "private": _b(),
               "dependencies": {"type": "object", "additionalProperties": _s()},
               "scripts": {"type": "object", "additionalProperties": _s()}}, ("name", "version")),
         {"name": "app", "version": "1.0.0"}),
        ("openapi_query_parameter",
         _obj({"name": _s(), "in": _e("query", "header", "path", "cookie"), "required": _b(),
               "description": _s(),
               "schema": _obj({"type": _e("string", "integer", "number", "boolean")}, ("type",))},
              ("name", "in")),
         {"name": "limit", "in": "query"}),
        ("sales_tax_calculation",
         _obj({"jurisdiction": _s(), "taxable_amount": _n(0), "rate_pct": _n(0, 30), "tax": _n(0),
               "exempt": _b()},
              ("jurisdiction", "taxable_amount", "tax")),
         {"jurisdiction": "WA", "taxable_amount": 100, "tax": 6.5}),
        ("dns_record_basic",
         _obj({"name": _s(), "type": _e("A", "AAAA", "CNAME", "MX", "TXT", "NS"), "ttl": _i(60, 86400),
               "value": _s(), "priority": _null("integer")}, ("name", "type", "value"), closed=True),
         {"name": "www", "type": "CNAME", "value": "example.org."}),
        ("pet_adoption_profile",
         _obj({"name": _s(), "species": _e("dog", "cat", "rabbit", "bird"), "age_years": _n(0, 40),
               "vaccinated": _b(), "good_with_kids": _null("boolean")}, ("name", "species")),
         {"name": "Rex", "species": "dog"}),
        ("saas_subscription_plan",
         _obj({"plan_id": _s(), "name": _s(), "monthly_price": _n(0), "annual_discount_pct": _i(0, 50),
               "seats": _i(1, 1000), "trial_days": _i(0, 90), "billing": _e("monthly", "annual")},
              ("plan_id", "monthly_price")),
         {"plan_id": "pro", "monthly_price": 29}),
        ("parcel_shipping_quote",
         _obj({"weight_kg": _n(0, 70), "service": _e("standard", "express", "overnight"), "insured": _b(),
               "insured_value": _n(0), "signature_required": _b()}, ("weight_kg", "service"),
              dependentRequired={"insured_value": ["insured"]}),
         {"weight_kg": 1.2, "service": "express"}),
        ("user_preferences_with_defaults",
         _obj({"theme": {"type": "string", "enum": ["light", "dark", "system"], "default": "system"},
               "language": {"type": "string", "default": "en"}, "timezone": _s(),
               "notifications": _obj({"email": _b(), "push": _b(), "sms": _b()}, closed=True)},
              closed=True, minProperties=1),
         {"theme": "dark"}),
        ("customer_tax_registration",
         _obj({"country": _e("US", "DE", "FR", "GB"), "company_name": _s(), "vat_id": _s(), "ein": _s()},
              ("country", "company_name"),
              allOf=[{"if": _obj({"country": _const("DE")}, ("country",)),
                      "then": {"required": ["vat_id"]}}]),
         {"country": "US", "company_name": "Acme"}),
        ("library_opening_hours",
         _obj({"branch": _s(), "open_hour": _i(0, 23), "close_hour": _i(1, 24), "closed_on_sunday": _b(),
               "wheelchair_accessible": _b()}, ("branch", "open_hour", "close_hour"), closed=True),
         {"branch": "Central", "open_hour": 9, "close_hour": 18}),
    ]


# --- string patterns ----------------------------------------------------------------------------

_SEMVER = r"^[0-9]+\.[0-9]+\.[0-9]+$"
_HEX_COLOR = r"^#[0-9a-fA-F]{6}$"


def _patterns() -> list[_Entry]:
    hh_mm = _p(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
    return [
        ("order_reference_codes",
         _obj({"order_ref": _p(r"^[A-Z]{3}-[0-9]{4}$"), "quantity": _i(1, 99), "gift": _b()},
              ("order_ref", "quantity"), closed=True),
         {"order_ref": "ABC-1234", "quantity": 1}),
        ("username_registration",
         _obj({"username": _p(r"^[a-z0-9_]{3,16}$"), "password": _s(minLength=8, maxLength=64),
               "accept_terms": _const(True)}, ("username", "password", "accept_terms"), closed=True),
         {"username": "neo_1", "password": "hunter22!", "accept_terms": True}),
        ("us_postal_address",
         _obj({"street": _s(), "city": _s(), "state": _p(r"^[A-Z]{2}$"),
               "zip": _p(r"^[0-9]{5}(-[0-9]{4})?$")},
              ("street", "city", "state", "zip"), closed=True),
         {"street": "1 Elm", "city": "Reno", "state": "NV", "zip": "89501"}),
        ("semver_package_release",
         _obj({"package": _p(r"^[a-z][a-z0-9-]{0,40}$"), "version": _p(_SEMVER), "prerelease": _b(),
               "changelog": _s(maxLength=2000)}, ("package", "version")),
         {"package": "left-pad", "version": "1.3.0"}),
        ("hex_color_theme",
         _obj({"primary": _p(_HEX_COLOR), "secondary": _p(_HEX_COLOR), "accent": _p(_HEX_COLOR),
               "dark_mode": _b()},
              ("primary",), closed=True),
         {"primary": "#1a2B3c"}),
        ("iban_bank_account",
         _obj({"holder": _s(), "iban": _p(r"^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"),
               "bic": _p(r"^[A-Z]{6}[A-Z0-9]{2}([A-Z0-9]{3})?$")}, ("holder", "iban")),
         {"holder": "Mia", "iban": "DE89370400440532013000"}),
        ("phone_contact_e164",
         _obj({"name": _s(), "phone": _p(r"^\+[1-9][0-9]{7,14}$"), "whatsapp": _b()}, ("name", "phone")),
         {"name": "Ola", "phone": "+4712345678"}),
        ("vehicle_registration",
         _obj({"plate": _p(r"^[A-Z]{2}[0-9]{2} [A-Z]{3}$"), "vin": _p(r"^[A-HJ-NPR-Z0-9]{17}$"),
               "taxed": _b()}, ("plate",), closed=True),
         {"plate": "AB12 CDE"}),
        ("blog_post_slug",
         _obj({"slug": _p(r"^[a-z0-9]+(-[a-z0-9]+)*$"), "title": _s(maxLength=120), "published": _b(),
               "word_count": _i(0)}, ("slug", "title")),
         {"slug": "hello-world", "title": "Hello"}),
        ("meeting_room_time_slot",
         _obj({"room": _e("atlas", "borealis", "cosmos"), "start": hh_mm, "end": hh_mm,
               "attendees": _i(1, 30)},
              ("room", "start", "end"), closed=True),
         {"room": "atlas", "start": "09:00", "end": "09:30"}),
        ("isbn_catalog_lookup",
         _obj({"isbn13": _p(r"^97[89][0-9]{10}$"), "available_copies": _i(0), "branch": _s()}, ("isbn13",)),
         {"isbn13": "9780306406157"}),
        ("git_branch_and_commit",
         _obj({"branch": _p(r"^[a-z][a-z0-9._/-]{0,49}$"), "commit": _p(r"^[0-9a-f]{40}$"),
               "protected": _b()},
              ("branch",)),
         {"branch": "main"}),
        ("airline_route",
         _obj({"airline": _p(r"^[A-Z0-9]{2}$"), "flight_no": _p(r"^[0-9]{1,4}$"), "origin": _p(r"^[A-Z]{3}$"),
               "destination": _p(r"^[A-Z]{3}$"), "codeshare": _b()}, ("airline", "origin", "destination"),
              closed=True),
         {"airline": "BA", "origin": "LHR", "destination": "JFK"}),
        ("money_amount_as_string",
         _obj({"amount": _p(r"^-?[0-9]+\.[0-9]{2}$"), "currency": _p(r"^[A-Z]{3}$")}, ("amount", "currency"),
              closed=True),
         {"amount": "12.50", "currency": "EUR"}),
        ("docker_image_reference",
         _obj({"image": _p(r"^[a-z0-9]+([._/-][a-z0-9]+)*$"), "tag": _p(r"^[A-Za-z0-9_.-]{1,128}$"),
               "pull_policy": _e("always", "if_not_present", "never")}, ("image",)),
         {"image": "library/redis", "tag": "7.2"}),
        ("environment_variables",
         _obj({"app_name": _p(r"^[a-z][a-z0-9-]*$")}, ("app_name",),
              patternProperties={"^[A-Z_][A-Z0-9_]*$": _s()}, additionalProperties=False),
         {"app_name": "api", "PATH": "/usr/bin"}),
        ("css_box_dimensions",
         _obj({"width": _p(r"^[0-9]+(px|em|rem|%)$"), "height": _p(r"^[0-9]+(px|em|rem|%)$"),
               "margin": _p(r"^[0-9]+(px|em|rem)( [0-9]+(px|em|rem)){0,3}$"), "visible": _b()}, ("width",)),
         {"width": "100%"}),
        ("cron_job_definition",
         _obj({"name": _s(), "schedule": _p(r"^[0-9*/,-]+ [0-9*/,-]+ [0-9*/,-]+ [0-9*/,-]+ [0-9*/,-]+$"),
               "command": _s(minLength=1), "enabled": _b(), "timeout_s": _i(1, 86400)},
              ("name", "schedule", "command")),
         {"name": "backup", "schedule": "0 3 * * *", "command": "backup.sh"}),
        ("network_device_mac",
         _obj({"hostname": _p(r"^[a-z0-9-]{1,63}$"), "mac": _p(r"^([0-9A-F]{2}:){5}[0-9A-F]{2}$"),
               "vlan": _i(1, 4094), "managed": _b()}, ("hostname", "mac")),
         {"hostname": "printer-2", "mac": "00:1A:2B:3C:4D:5E"}),
        ("coupon_code_redemption",
         _obj({"code": _p(r"^[A-Z0-9]{8}$"), "discount_pct": _i(5, 90), "single_use": _b()},
              ("code", "discount_pct"), closed=True),
         {"code": "SAVE2024", "discount_pct": 10}),
        ("employee_badge",
         _obj({"badge_id": _p(r"^EMP[0-9]{6}$"), "name": _s(), "access_level": _i(1, 5), "active": _b()},
              ("badge_id", "name")),
         {"badge_id": "EMP000123", "name": "Kai"}),
        ("jira_style_ticket",
         _obj({"key": _p(r"^[A-Z][A-Z0-9]{1,9}-[0-9]{1,6}$"), "summary": _s(maxLength=255),
               "story_points": {"enum": [1, 2, 3, 5, 8, 13]}, "type": _e("bug", "story", "task", "epic")},
              ("key", "summary")),
         {"key": "PROJ-42", "summary": "Fix login"}),
        ("canadian_postal_code",
         _obj({"city": _s(), "province": _e("AB", "BC", "MB", "NB", "NL", "NS", "ON", "PE", "QC", "SK"),
               "postal_code": _p(r"^[A-Z][0-9][A-Z] [0-9][A-Z][0-9]$")}, ("province", "postal_code")),
         {"province": "ON", "postal_code": "K1A 0B1"}),
        ("chemical_compound_entry",
         _obj({"name": _s(), "cas_number": _p(r"^[0-9]{2,7}-[0-9]{2}-[0-9]$"), "molar_mass": _n(0),
               "hazardous": _b()}, ("name", "cas_number")),
         {"name": "water", "cas_number": "7732-18-5"}),
        ("twitter_style_handle",
         _obj({"handle": _p(r"^@[A-Za-z0-9_]{1,15}$"), "display_name": _s(maxLength=50), "followers": _i(0),
               "verified": _b()}, ("handle",), closed=True),
         {"handle": "@radix"}),
    ]


# --- formats ------------------------------------------------------------------------------------

def _formats() -> list[_Entry]:
    return [
        ("newsletter_signup",
         _obj({"email": _f("email"), "first_name": _s(maxLength=40), "consent": _const(True),
               "frequency": _e("daily", "weekly", "monthly")}, ("email", "consent"), closed=True),
         {"email": "ana@example.com", "consent": True}),
        ("birthday_reminder",
         _obj({"name": _s(), "birth_date": _f("date"), "remind_days_before": _i(0, 30)},
              ("name", "birth_date")),
         {"name": "Grandma", "birth_date": "1950-04-12"}),
        ("server_inventory_host",
         _obj({"hostname": _s(), "ipv4": _f("ipv4"), "ipv6": _null("string", format="ipv6"),
               "os": _e("linux", "windows", "bsd"), "cores": _i(1, 512)}, ("hostname", "ipv4"), closed=True),
         {"hostname": "db1", "ipv4": "10.0.0.5"}),
        ("session_token_record",
         _obj({"session_id": _f("uuid"), "user_id": _f("uuid"), "created_on": _f("date"),
               "expires_on": _f("date"), "revoked": _b()}, ("session_id", "user_id")),
         {"session_id": "123e4567-e89b-12d3-a456-426614174000",
          "user_id": "0f8fad5b-d9cb-469f-a165-70867728950e"}),
        ("firewall_rule",
         _obj({"source_ip": _f("ipv4"), "destination_ip": _f("ipv4"), "port": _i(1, 65535),
               "protocol": _e("tcp", "udp", "icmp"), "action": _e("allow", "deny")},
              ("source_ip", "protocol", "action"), closed=True),
         {"source_ip": "192.168.1.10", "protocol": "tcp", "action": "deny"}),
        ("passport_details",
         _obj({"number": _p(r"^[A-Z0-9]{9}$"), "nationality": _p(r"^[A-Z]{3}$"), "issued_on": _f("date"),
               "expires_on": _f("date")}, ("number", "expires_on")),
         {"number": "X12345678", "expires_on": "2031-01-31"}),
        ("meeting_invite",
         _obj({"title": _s(), "organizer": _f("email"), "attendees": _a(_f("email"), 1, 20),
               "day": _f("date"), "online": _b()}, ("title", "organizer", "attendees")),
         {"title": "Sync", "organizer": "a@x.org", "attendees": ["b@x.org"]}),
        ("business_contact_card",
         _obj({"name": _s(), "email": _f("email"), "company": _s(), "title": _s(), "phone": _s()},
              ("name", "email")),
         {"name": "Li", "email": "li@corp.example"}),
        ("public_holiday_calendar",
         _obj({"country": _s(minLength=2, maxLength=2), "year": _i(1900, 2100),
               "holidays": _a(_obj({"date": _f("date"), "name": _s()}, ("date", "name"), closed=True),
                              max_items=30)},
              ("country", "year", "holidays")),
         {"country": "FR", "year": 2025, "holidays": [{"date": "2025-07-14", "name": "Bastille Day"}]}),
        ("api_key_record",
         _obj({"key_id": _f("uuid"), "owner": _f("email"),
               "scopes": _a(_e("read", "write", "admin"), uniqueItems=True), "created_on": _f("date"),
               "revoked": _b()}, ("key_id", "owner")),
         {"key_id": "9b2e6f1a-3c4d-4e5f-8a9b-0c1d2e3f4a5b", "owner": "ops@example.com"}),
        ("network_interface_config",
         _obj({"name": _s(), "ipv4_addresses": _a(_f("ipv4")), "ipv6_addresses": _a(_f("ipv6")),
               "mtu": _i(576, 9000), "dhcp": _b()}, ("name",)),
         {"name": "eth0", "ipv4_addresses": ["172.16.0.2"]}),
        ("device_registration",
         _obj({"device_uuid": _f("uuid"), "owner_email": _f("email"), "registered_on": _f("date"),
               "model": _s()},
              ("device_uuid", "owner_email"), closed=True),
         {"device_uuid": "6fa459ea-ee8a-3ca4-894e-db77e160355e", "owner_email": "me@home.net"}),
        ("warranty_claim",
         _obj({"claim_id": _f("uuid"), "purchase_date": _f("date"), "serial_number": _s(),
               "customer_email": _f("email"), "issue": _s(maxLength=1000)},
              ("claim_id", "purchase_date", "issue")),
         {"claim_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7", "purchase_date": "2024-11-02",
          "issue": "no power"}),
        ("audit_log_entry",
         _obj({"event_id": _f("uuid"), "actor": _f("email"),
               "action": _e("login", "logout", "create", "delete"), "source_ip": _f("ipv4"),
               "on": _f("date")}, ("event_id", "action")),
         {"event_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "action": "login"}),
        ("wireguard_peer",
         _obj({"public_key": _p(r"^[A-Za-z0-9+/]{43}=$"), "endpoint": _f("ipv4"), "listen_port": _i(1, 65535),
               "allowed_ips": _a(_s())}, ("public_key",)),
         {"public_key": "x" * 43 + "="}),
        ("library_loan",
         _obj({"isbn": _p(r"^[0-9]{13}$"), "member_email": _f("email"), "borrowed_on": _f("date"),
               "due_on": _f("date"), "renewals": _i(0, 3)}, ("isbn", "member_email", "due_on")),
         {"isbn": "9780140449136", "member_email": "reader@lib.org", "due_on": "2025-02-01"}),
        ("conference_registration",
         _obj({"attendee_email": _f("email"), "ticket": _e("student", "standard", "vip"),
               "arrival": _f("date"), "dietary": _e("none", "vegetarian", "vegan", "halal", "kosher"),
               "badge_name": _s(maxLength=24)},
              ("attendee_email", "ticket")),
         {"attendee_email": "dev@conf.io", "ticket": "student"}),
        ("employee_onboarding",
         _obj({"work_email": _f("email"), "start_date": _f("date"), "manager_email": _f("email"),
               "laptop": _e("mac", "linux", "windows")}, ("work_email", "start_date")),
         {"work_email": "new@co.com", "start_date": "2025-03-03"}),
        ("dns_a_record",
         _obj({"name": _s(), "address": _f("ipv4"), "ttl": _i(60, 86400)}, ("name", "address"), closed=True),
         {"name": "api", "address": "203.0.113.7"}),
        ("dns_aaaa_record",
         _obj({"name": _s(), "address": _f("ipv6"), "ttl": _i(60, 86400)}, ("name", "address"), closed=True),
         {"name": "api", "address": "2001:db8::7"}),
        ("user_account_export",
         _obj({"id": _f("uuid"), "email": _f("email"), "signup_date": _f("date"),
               "last_login_date": _null("string", format="date"), "plan": _e("free", "pro")},
              ("id", "email", "signup_date")),
         {"id": "00000000-0000-4000-8000-000000000000", "email": "u@x.io", "signup_date": "2023-01-09"}),
        ("package_delivery_tracking",
         _obj({"tracking_id": _f("uuid"), "ship_date": _f("date"), "estimated_delivery": _f("date"),
               "recipient_email": _f("email"),
               "status": _e("label_created", "in_transit", "delivered", "lost")},
              ("tracking_id", "status")),
         {"tracking_id": "a8098c1a-f86e-11da-bd1a-00112444be1e", "status": "in_transit"}),
        ("load_balancer_backend",
         _obj({"pool": _s(), "address": _f("ipv6"), "port": _i(1, 65535), "weight": _i(0, 100),
               "drain": _b()},
              ("pool", "address", "port")),
         {"pool": "web", "address": "fe80::1", "port": 443}),
        ("clinic_appointment",
         _obj({"patient_id": _f("uuid"), "appointment_date": _f("date"), "clinician": _s(),
               "reason": _e("checkup", "follow_up", "vaccination", "consultation"), "telehealth": _b()},
              ("patient_id", "appointment_date", "reason")),
         {"patient_id": "5f1d7a9e-3b2c-4d6e-8f90-123456789abc", "appointment_date": "2025-06-30",
          "reason": "checkup"}),
    ]


# --- unions -------------------------------------------------------------------------------------

def _unions() -> list[_Entry]:
    jsonrpc_id = {"anyOf": [_s(), _i(), {"type": "null"}]}
    scalar = {"anyOf": [_s(), _n(), _b()]}
    position = _a(_n(), 2, 3)
    return [
        ("payment_method_oneof",
         _obj({"order_id": _s(), "method": {"oneOf": [
             _obj({"type": _const("card"), "brand": _e("visa", "mastercard", "amex"),
                   "last4": _p(r"^[0-9]{4}$")},
                  ("type", "brand", "last4"), closed=True),
             _obj({"type": _const("bank_transfer"), "iban": _p(r"^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$")},
                  ("type", "iban"), closed=True),
             _obj({"type": _const("wallet"), "provider": _e("apple_pay", "google_pay", "paypal")},
                  ("type", "provider"), closed=True)]}}, ("order_id", "method")),
         {"order_id": "o1", "method": {"type": "wallet", "provider": "paypal"}}),
        ("geometric_shape_discriminated",
         {"oneOf": [
             _obj({"kind": _const("circle"), "radius": _n(0)}, ("kind", "radius"), closed=True),
             _obj({"kind": _const("rectangle"), "width": _n(0), "height": _n(0)}, ("kind", "width", "height"),
                  closed=True),
             _obj({"kind": _const("triangle"), "a": _n(0), "b": _n(0), "c": _n(0)}, ("kind", "a", "b", "c"),
                  closed=True)]},
         {"kind": "circle", "radius": 2}),
        ("notification_channel_preference",
         _obj({"user_id": _s(), "channel": {"anyOf": [
             _obj({"via": _const("email"), "address": _f("email")}, ("via", "address")),
             _obj({"via": _const("sms"), "phone": _p(r"^\+[0-9]{8,15}$")}, ("via", "phone")),
             _obj({"via": _const("push"), "device_token": _s()}, ("via", "device_token"))]}},
              ("user_id", "channel")),
         {"user_id": "u1", "channel": {"via": "push", "device_token": "t"}}),
        ("jsonrpc_response_message",
         {"oneOf": [
             _obj({"jsonrpc": _const("2.0"), "id": jsonrpc_id, "result": {}}, ("jsonrpc", "id", "result"),
                  closed=True),
             _obj({"jsonrpc": _const("2.0"), "id": jsonrpc_id,
                   "error": _obj({"code": _i(), "message": _s(), "data": {}}, ("code", "message"))},
                  ("jsonrpc", "id", "error"), closed=True)]},
         {"jsonrpc": "2.0", "id": 1, "result": "pong"}),
        ("jsonrpc_request_message",
         _obj({"jsonrpc": _const("2.0"), "method": _s(minLength=1),
               "params": {"anyOf": [{"type": "array"}, {"type": "object"}]}, "id": jsonrpc_id},
              ("jsonrpc", "method"), closed=True),
         {"jsonrpc": "2.0", "method": "sum", "params": [1, 2], "id": "r1"}),
        ("nullable_price_anyof",
         _obj({"product_name": _s(), "price": {"anyOf": [_n(0), {"type": "null"}]},
               "sale_price": {"anyOf": [_n(0), {"type": "null"}]}}, ("product_name", "price")),
         {"product_name": "Mug", "price": None}),
        ("record_identifier_string_or_int",
         _obj({"id": {"anyOf": [_i(1), _p(r"^[a-z]+_[0-9]+$")]}, "label": _s()}, ("id",)),
         {"id": "user_7"}),
        ("geojson_geometry",
         {"$defs": {"position": position}, "oneOf": [
             _obj({"type": _const("Point"), "coordinates": _ref("#/$defs/position")},
                  ("type", "coordinates")),
             _obj({"type": _const("LineString"), "coordinates": _a(_ref("#/$defs/position"), 2)},
                  ("type", "coordinates")),
             _obj({"type": _const("Polygon"), "coordinates": _a(_a(_ref("#/$defs/position")))},
                  ("type", "coordinates"))]},
         {"type": "Point", "coordinates": [10.7, 59.9]}),
        ("webhook_event_envelope",
         _obj({"event_id": _s(), "event": _e("order.created", "customer.deleted"), "data": {"oneOf": [
             _obj({"order_id": _s(), "amount": _n(0)}, ("order_id", "amount"), closed=True),
             _obj({"customer_id": _s(), "reason": _s()}, ("customer_id",), closed=True)]}},
              ("event_id", "event", "data")),
         {"event_id": "e1", "event": "customer.deleted", "data": {"customer_id": "c1"}}),
        ("search_filter_clause",
         _obj({"index": _s(), "filter": {"anyOf": [
             _obj({"term": _obj({"field": _s(), "value": _s()}, ("field", "value"))}, ("term",), closed=True),
             _obj({"range": _obj({"field": _s(), "gte": _n(), "lte": _n()}, ("field",))}, ("range",),
                  closed=True),
             _obj({"exists": _obj({"field": _s()}, ("field",))}, ("exists",), closed=True)]}},
              ("index", "filter")),
         {"index": "logs", "filter": {"exists": {"field": "user"}}}),
        ("typed_config_value",
         _obj({"key": _s(), "value": {"anyOf": [_s(), _n(), _b(), _a(_s())]}, "secret": _b()},
              ("key", "value")),
         {"key": "retries", "value": 3}),
        ("assistant_content_blocks",
         _obj({"role": _const("assistant"), "content": _a({"oneOf": [
             _obj({"type": _const("text"), "text": _s()}, ("type", "text"), closed=True),
             _obj({"type": _const("tool_call"), "name": _p(r"^[a-z_]{1,32}$"),
                   "arguments": {"type": "object"}},
                  ("type", "name", "arguments"), closed=True)]})}, ("role", "content")),
         {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}),
        ("api_result_success_or_error",
         {"oneOf": [_obj({"ok": _const(True), "data": {"type": "object"}}, ("ok", "data"), closed=True),
                    _obj({"ok": _const(False),
                          "error": _obj({"code": _s(), "message": _s()}, ("code", "message"))},
                         ("ok", "error"), closed=True)]},
         {"ok": False, "error": {"code": "E1", "message": "bad"}}),
        ("job_schedule_trigger",
         _obj({"job": _s(), "trigger": {"oneOf": [
             _obj({"cron": _p(r"^[0-9*/,-]+ [0-9*/,-]+ [0-9*/,-]+ [0-9*/,-]+ [0-9*/,-]+$")}, ("cron",),
                  closed=True),
             _obj({"every_minutes": _i(1, 10080)}, ("every_minutes",), closed=True),
             _obj({"once_on": _f("date")}, ("once_on",), closed=True)]}}, ("job", "trigger")),
         {"job": "report", "trigger": {"every_minutes": 60}}),
        ("chat_content_parts",
         _obj({"role": _e("user", "system"), "parts": _a({"oneOf": [
             _obj({"type": _const("text"), "text": _s()}, ("type", "text"), closed=True),
             _obj({"type": _const("image_url"), "url": _s(), "detail": _e("low", "high", "auto")},
                  ("type", "url"), closed=True)]}, 1, 5)}, ("role", "parts")),
         {"role": "user", "parts": [{"type": "text", "text": "look"}]}),
        ("lab_measurement_or_na",
         _obj({"test": _s(), "value": {"anyOf": [_n(), _const("n/a")]}, "unit": _s()}, ("test", "value")),
         {"test": "glucose", "value": "n/a"}),
        ("postal_address_us_or_international",
         _obj({"name": _s(), "address": {"oneOf": [
             _obj({"country": _const("US"), "street": _s(), "state": _p(r"^[A-Z]{2}$"),
                   "zip": _p(r"^[0-9]{5}$")},
                  ("country", "street", "state", "zip"), closed=True),
             _obj({"country": _p(r"^[A-Z]{2}$"), "street": _s(), "city": _s(), "postal_code": _s()},
                  ("country", "street", "city", "postal_code"), closed=True)]}}, ("name", "address")),
         {"name": "Bo", "address": {"country": "US", "street": "5 Oak", "state": "TX", "zip": "73301"}}),
        ("auth_credentials_variant",
         {"oneOf": [_obj({"api_key": _s(minLength=16)}, ("api_key",), closed=True),
                    _obj({"username": _s(), "password": _s()}, ("username", "password"), closed=True),
                    _obj({"access_token": _s(), "expires_in": _i(0)}, ("access_token",), closed=True)]},
         {"username": "u", "password": "p"}),
        ("http_cache_policy",
         _obj({"path_prefix": _s(), "max_age": {"anyOf": [_i(0, 31536000), _const("no-store")]},
               "public": _b()}, ("path_prefix", "max_age")),
         {"path_prefix": "/static", "max_age": 3600}),
        ("form_field_definition",
         {"oneOf": [
             _obj({"kind": _const("text"), "label": _s(), "max_length": _i(1, 10000)}, ("kind", "label"),
                  closed=True),
             _obj({"kind": _const("number"), "label": _s(), "min": _n(), "max": _n()}, ("kind", "label"),
                  closed=True),
             _obj({"kind": _const("select"), "label": _s(), "options": _a(_s(), 1, 20)},
                  ("kind", "label", "options"), closed=True)]},
         {"kind": "text", "label": "Name"}),
        ("discount_rule_variant",
         _obj({"code": _s(), "rule": {"oneOf": [
             _obj({"type": _const("percent"), "percent": _i(1, 100)}, ("type", "percent"), closed=True),
             _obj({"type": _const("fixed"), "amount": _n(0), "currency": _e("USD", "EUR")},
                  ("type", "amount"), closed=True),
             _obj({"type": _const("buy_x_get_y"), "buy": _i(1), "get": _i(1)}, ("type", "buy", "get"),
                  closed=True)]}},
              ("code", "rule")),
         {"code": "TEN", "rule": {"type": "percent", "percent": 10}}),
        ("event_recurrence_rule",
         _obj({"title": _s(), "recurrence": {"anyOf": [{"type": "null"}, _obj(
             {"freq": _e("daily", "weekly", "monthly", "yearly"), "interval": _i(1, 365),
              "count": _i(1, 1000)},
             ("freq",), closed=True)]}}, ("title", "recurrence")),
         {"title": "Gym", "recurrence": None}),
        ("mixed_scalar_tags",
         _obj({"item": _s(), "tags": _a({"anyOf": [_s(maxLength=30), _i()]})}, ("item", "tags")),
         {"item": "box", "tags": ["fragile", 3]}),
        ("air_quality_reading_variant",
         _obj({"station": _s(), "reading": {"oneOf": [
             _obj({"pm25_ugm3": _n(0)}, ("pm25_ugm3",), closed=True),
             _obj({"co2_ppm": _i(0)}, ("co2_ppm",), closed=True),
             _obj({"ozone_ppb": _n(0)}, ("ozone_ppb",), closed=True)]}}, ("station", "reading")),
         {"station": "A7", "reading": {"co2_ppm": 415}}),
        ("feature_toggle_condition",
         _obj({"flag": _s(), "when": {"anyOf": [
             _obj({"attribute": _s(), "equals": scalar}, ("attribute", "equals"), closed=True),
             _obj({"percentage": _i(0, 100)}, ("percentage",), closed=True)]}}, ("flag", "when")),
         {"flag": "beta", "when": {"percentage": 5}}),
    ]


# --- bounded arrays -----------------------------------------------------------------------------

def _bounded_arrays() -> list[_Entry]:
    byte = _i(0, 255)
    return [
        ("rgb_color_tuple",
         _obj({"name": _s(), "rgb": _a(byte, 3, 3)}, ("name", "rgb"), closed=True),
         {"name": "teal", "rgb": [0, 128, 128]}),
        ("top_three_favorites",
         _obj({"category": _e("books", "films", "albums"), "picks": _a(_s(maxLength=60), 1, 3)},
              ("category", "picks")),
         {"category": "films", "picks": ["Alien"]}),
        ("lat_lon_point",
         _obj({"label": _s(), "coordinates": _a(_n(-180, 180), 2, 2)}, ("coordinates",)),
         {"coordinates": [48.85, 2.35]}),
        ("football_team_lineup",
         _obj({"team": _s(), "players": _a(_obj({"name": _s(), "number": _i(1, 99),
                                                 "position": _e("GK", "DF", "MF", "FW")}, ("name", "number")),
                                           1, 11)},
              ("team", "players")),
         {"team": "FC", "players": [{"name": "Ada", "number": 1}]}),
        ("multiple_choice_question",
         _obj({"question": _s(), "choices": _a(_s(), 2, 5), "correct_index": _i(0, 4), "points": _i(1, 10)},
              ("question", "choices", "correct_index"), closed=True),
         {"question": "2+2?", "choices": ["3", "4"], "correct_index": 1}),
        ("shopping_cart_limited",
         _obj({"cart_id": _s(),
               "items": _a(_obj({"sku": _s(), "qty": _i(1, 10)}, ("sku", "qty"), closed=True), max_items=50)},
              ("cart_id", "items")),
         {"cart_id": "c1", "items": []}),
        ("article_tags_unique",
         _obj({"article_id": _i(1), "tags": _a(_s(minLength=2, maxLength=24), 0, 10, uniqueItems=True)},
              ("article_id", "tags")),
         {"article_id": 1, "tags": []}),
        ("pick3_lottery_ticket",
         _obj({"draw": _i(1), "digits": _a(_i(0, 9), 3, 3), "boxed": _b()}, ("draw", "digits"), closed=True),
         {"draw": 901, "digits": [1, 2, 3]}),
        ("star_rating_histogram",
         _obj({"product_id": _s(), "counts": _a(_i(0), max_items=5)}, ("product_id", "counts")),
         {"product_id": "p", "counts": [0, 1, 4, 9, 20]}),
        ("bounding_box_corners",
         _obj({"southwest": _a(_n(), 2, 2), "northeast": _a(_n(), 2, 2)}, ("southwest", "northeast"),
              closed=True),
         {"southwest": [0, 0], "northeast": [1, 1]}),
        ("short_playlist",
         _obj({"title": _s(), "tracks": _a(_obj({"title": _s(), "seconds": _i(1, 3600)}, ("title",)),
                                           max_items=20)}, ("title", "tracks")),
         {"title": "Mix", "tracks": []}),
        ("matrix_2x2",
         _obj({"rows": _a(_a(_n(), 2, 2), 2, 2)}, ("rows",), closed=True),
         {"rows": [[1, 0], [0, 1]]}),
        ("image_thumbnail_set",
         _obj({"image_id": _s(),
               "thumbnails": _a(_obj({"width": _i(1, 4096), "height": _i(1, 4096), "url": _s()},
                                     ("width", "height", "url")), 1, 4)},
              ("image_id", "thumbnails")),
         {"image_id": "i", "thumbnails": [{"width": 64, "height": 64, "url": "/t.png"}]}),
        ("dietary_preferences_multiselect",
         _obj({"guest": _s(),
               "selected": _a(_e("vegetarian", "vegan", "gluten_free", "nut_free", "halal", "kosher"), 1, 3,
                              uniqueItems=True)}, ("guest", "selected")),
         {"guest": "Ivy", "selected": ["vegan"]}),
        ("http_retry_policy",
         _obj({"max_attempts": _i(1, 10), "backoff_ms": _a(_i(0, 60000), 1, 5),
               "retry_on": _a(_i(400, 599), max_items=8)}, ("max_attempts", "backoff_ms")),
         {"max_attempts": 3, "backoff_ms": [100]}),
        ("brand_color_palette",
         _obj({"brand": _s(), "colors": _a(_a(byte, 3, 3), 1, 8)}, ("brand", "colors")),
         {"brand": "Co", "colors": [[255, 0, 0]]}),
        ("time_series_window",
         _obj({"metric": _s(), "points": _a({"type": "array", "prefixItems": [_i(0), _n()], "items": False,
                                             "minItems": 2}, max_items=10)}, ("metric", "points")),
         {"metric": "cpu", "points": [[1700000000, 0.5]]}),
        ("recipe_steps_bounded",
         _obj({"dish": _s(), "steps": _a(_s(minLength=1, maxLength=200), 1, 12)}, ("dish", "steps")),
         {"dish": "Tea", "steps": ["Boil water"]}),
        ("emergency_contacts",
         _obj({"person": _s(), "contacts": _a(_obj({"name": _s(), "phone": _s(), "relation": _s()},
                                                   ("name", "phone"), closed=True), 1, 3)},
              ("person", "contacts")),
         {"person": "Al", "contacts": [{"name": "Bea", "phone": "555"}]}),
        ("chess_move_list",
         _obj({"game_id": _s(), "moves": _a(_p(r"^[a-h][1-8][a-h][1-8][qrbn]?$"), max_items=20),
               "result": _e("1-0", "0-1", "1/2-1/2", "*")}, ("game_id", "moves")),
         {"game_id": "g", "moves": ["e2e4"]}),
        ("theater_seat_selection",
         _obj({"show_id": _s(), "seats": _a(_p(r"^[0-9]{1,2}[A-F]$"), 1, 4, uniqueItems=True)},
              ("show_id", "seats")),
         {"show_id": "s1", "seats": ["12C"]}),
        ("dice_roll_result",
         _obj({"dice": _a(_i(1, 6), 1, 3), "total": _i(1, 18)}, ("dice", "total"), closed=True),
         {"dice": [4], "total": 4}),
        ("gps_track_segment",
         _obj({"activity": _e("run", "ride", "walk"), "points": _a(_a(_n(), 2, 2), 2, 100)},
              ("activity", "points")),
         {"activity": "run", "points": [[0, 0], [0.001, 0.001]]}),
        ("rgba_color",
         _obj({"rgba": {"type": "array", "prefixItems": [byte, byte, byte, _n(0, 1)], "items": False,
                        "minItems": 3, "maxItems": 4}}, ("rgba",)),
         {"rgba": [10, 20, 30]}),
        ("spoken_languages_profile",
         _obj({"person": _s(), "languages": _a(_e("en", "es", "fr", "de", "zh", "ar", "hi", "pt"), 1, 3)},
              ("person", "languages")),
         {"person": "Zoe", "languages": ["en"]}),
        ("exam_answer_sheet",
         _obj({"student": _s(), "answers": _a(_e("A", "B", "C", "D"), max_items=40), "submitted": _b()},
              ("student", "answers")),
         {"student": "Tom", "answers": ["A", "C"]}),
    ]


# --- recursive schemas --------------------------------------------------------------------------

def _recursive() -> list[_Entry]:
    return [
        ("comment_thread_recursive",
         _obj({"author": _s(), "text": _s(maxLength=500), "score": _i(), "replies": _a(_ref("#"))},
              ("author", "text")),
         {"author": "kim", "text": "first"}),
        ("file_system_tree",
         {"$ref": "#/$defs/entry", "$defs": {"entry": _obj(
             {"name": _s(minLength=1), "kind": _e("file", "directory", "symlink"), "size_bytes": _i(0),
              "children": _a(_ref("#/$defs/entry"))}, ("name", "kind"), closed=True)}},
         {"name": "/", "kind": "directory"}),
        ("org_chart_definitions",
         {"$ref": "#/definitions/employee", "definitions": {"employee": _obj(
             {"name": _s(), "title": _s(), "reports": _a(_ref("#/definitions/employee"))},
                                                                             ("name", "title"))}},
         {"name": "Eve", "title": "CEO"}),
        ("linked_list_node",
         _obj({"value": _i(), "next": _nullable_ref("#")}, ("value",), closed=True),
         {"value": 1, "next": {"value": 2}}),
        ("product_category_taxonomy",
         _obj({"name": _s(), "slug": _p(r"^[a-z0-9-]+$"), "subcategories": _a(_ref("#"), max_items=10)},
              ("name", "slug")),
         {"name": "Garden", "slug": "garden"}),
        ("bill_of_materials",
         {"$ref": "#/$defs/part", "$defs": {"part": _obj(
             {"part_number": _p(r"^P-[0-9]{5}$"), "description": _s(), "quantity": _i(1), "unit_cost": _n(0),
              "components": _a(_ref("#/$defs/part"))}, ("part_number", "quantity"))}},
         {"part_number": "P-00001", "quantity": 1}),
        ("nested_navigation_menu",
         _obj({"label": _s(maxLength=40), "href": _s(), "children": _a(_ref("#"))}, ("label",), closed=True),
         {"label": "Home", "href": "/"}),
        ("family_tree_person",
         {"$ref": "#/definitions/person", "definitions": {"person": _obj(
             {"name": _s(), "birth_date": _f("date"), "children": _a(_ref("#/definitions/person"))},
                                                                         ("name",))}},
         {"name": "Ruth", "birth_date": "1931-08-02"}),
        ("email_thread_message",
         {"$ref": "#/$defs/message", "$defs": {"message": _obj(
             {"sender": _s(), "subject": _s(), "body": _s(), "replies": _a(_ref("#/$defs/message"))},
             ("sender", "body"), closed=True)}},
         {"sender": "a", "body": "hello"}),
        ("task_with_subtasks",
         _obj({"title": _s(), "done": _b(), "estimate_hours": _n(0), "subtasks": _a(_ref("#"))},
              ("title", "done")),
         {"title": "Ship", "done": False}),
        ("binary_search_tree",
         {"$ref": "#/$defs/node", "$defs": {"node": _obj(
             {"key": _i(), "left": _nullable_ref("#/$defs/node"), "right": _nullable_ref("#/$defs/node")},
             ("key",), closed=True)}},
         {"key": 5, "left": None}),
        ("decision_tree_model",
         {"$ref": "#/$defs/node", "$defs": {"node": _obj(
             {"feature": _s(), "threshold": _n(), "leaf_value": _n(), "left": _ref("#/$defs/node"),
              "right": _ref("#/$defs/node")}, closed=True, minProperties=1)}},
         {"leaf_value": 0.5}),
        ("role_inheritance_hierarchy",
         {"$ref": "#/definitions/role", "definitions": {"role": _obj(
             {"name": _s(), "permissions": _a(_e("read", "write", "delete", "admin")),
              "inherits": _a(_ref("#/definitions/role"))}, ("name",))}},
         {"name": "viewer"}),
        ("geographic_region_hierarchy",
         _obj({"name": _s(), "iso_code": _p(r"^[A-Z]{2}(-[A-Z0-9]{1,3})?$"), "population": _i(0),
               "subregions": _a(_ref("#"))}, ("name",)),
         {"name": "Norway", "iso_code": "NO"}),
        ("mind_map_node",
         _obj({"topic": _s(maxLength=60), "color": _e("red", "blue", "green", "yellow"),
               "children": _a(_ref("#"), max_items=8)}, ("topic",)),
         {"topic": "Ideas"}),
        ("work_breakdown_structure",
         {"$ref": "#/definitions/item", "definitions": {"item": _obj(
             {"wbs_code": _p(r"^[0-9]+(\.[0-9]+)*$"), "name": _s(), "estimate_hours": _n(0),
              "children": _a(_ref("#/definitions/item"))}, ("wbs_code", "name"))}},
         {"wbs_code": "1.2", "name": "Design"}),
        ("chat_branching_conversation",
         _obj({"role": _e("user", "assistant"), "content": _s(), "alternatives": _a(_ref("#"), max_items=3)},
              ("role", "content")),
         {"role": "user", "content": "hi"}),
        ("package_dependency_tree",
         {"$ref": "#/$defs/package", "$defs": {"package": _obj(
             {"name": _s(), "version": _p(_SEMVER), "dev": _b(), "dependencies": _a(_ref("#/$defs/package"))},
             ("name", "version"))}},
         {"name": "lodash", "version": "4.17.21"}),
        ("prefix_trie_node",
         {"$ref": "#/$defs/node", "$defs": {"node": _obj(
             {"terminal": _b(), "count": _i(0),
              "children": {"type": "object", "additionalProperties": _ref("#/$defs/node")}}, ("terminal",))}},
         {"terminal": False, "children": {"a": {"terminal": True}}}),
        ("nested_settings_group",
         _obj({"name": _s(),
               "settings": {"type": "object", "additionalProperties": {"anyOf": [_s(), _n(), _b()]}},
               "groups": _a(_ref("#"))}, ("name",)),
         {"name": "editor", "settings": {"tab_size": 4}}),
        *_mutually_recursive(),
    ]


def _mutually_recursive() -> list[_Entry]:
    comparison_value = {"anyOf": [_s(), _n(), {"type": "null"}]}
    return [
        ("arithmetic_expression_ast",
         {"$ref": "#/$defs/expr", "$defs": {
             "expr": {"anyOf": [_obj({"kind": _const("number"), "value": _n()}, ("kind", "value"),
                                     closed=True),
                                _obj({"kind": _const("variable"), "name": _p(r"^[a-z][a-z0-9_]*$")},
                                     ("kind", "name"), closed=True),
                                _ref("#/$defs/apply")]},
             "apply": _obj({"kind": _const("apply"), "op": _e("add", "sub", "mul", "div", "neg"),
                            "args": _a(_ref("#/$defs/expr"), max_items=4)}, ("kind", "op"), closed=True)}},
         {"kind": "apply", "op": "add",
          "args": [{"kind": "number", "value": 1}, {"kind": "variable", "name": "x"}]}),
        ("html_dom_tree",
         {"$ref": "#/$defs/element", "$defs": {
             "node": {"anyOf": [_obj({"text": _s()}, ("text",), closed=True), _ref("#/$defs/element")]},
             "element": _obj({"tag": _e("div", "span", "p", "ul", "li", "a", "strong", "em"),
                              "attributes": {"type": "object", "additionalProperties": _s()},
                              "children": _a(_ref("#/$defs/node"))}, ("tag",), closed=True)}},
         {"tag": "p", "children": [{"text": "hi"}]}),
        ("json_value_document",
         {"$ref": "#/$defs/value", "$defs": {
             "value": {"anyOf": [_s(), _n(), _b(), {"type": "null"}, _ref("#/$defs/array"),
                                 _ref("#/$defs/object")]},
             "array": _a(_ref("#/$defs/value")),
             "object": {"type": "object", "additionalProperties": _ref("#/$defs/value")}}},
         {"key": [1, "two", None]}),
        ("boolean_query_filter",
         {"$ref": "#/definitions/filter", "definitions": {
             "filter": {"oneOf": [_ref("#/definitions/condition"), _ref("#/definitions/group")]},
             "condition": _obj({"field": _s(), "op": _e("eq", "ne", "lt", "gt", "contains"),
                                "value": {"anyOf": [_s(), _n(), _b()]}}, ("field", "op", "value"),
                               closed=True),
             "group": _obj({"combinator": _e("and", "or"),
                            "filters": _a(_ref("#/definitions/filter"), max_items=5)},
                           ("combinator",), closed=True)}},
         {"field": "age", "op": "gt", "value": 30}),
        ("markdown_document_blocks",
         _obj({"title": _s(), "blocks": _a(_ref("#/$defs/block"))}, ("title",), **{"$defs": {
             "block": {"oneOf": [_ref("#/$defs/paragraph"), _ref("#/$defs/heading"), _ref("#/$defs/list")]},
             "paragraph": _obj({"type": _const("paragraph"), "text": _s()}, ("type", "text"), closed=True),
             "heading": _obj({"type": _const("heading"), "level": _i(1, 6), "text": _s()},
                             ("type", "level", "text"), closed=True),
             "list": _obj({"type": _const("list"), "ordered": _b(), "items": _a(_ref("#/$defs/list_item"))},
                          ("type",), closed=True),
             "list_item": _obj({"text": _s(), "blocks": _a(_ref("#/$defs/block"))}, ("text",),
                               closed=True)}}),
         {"title": "Notes", "blocks": [{"type": "heading", "level": 1, "text": "Intro"}]}),
        ("company_department_tree",
         {"$ref": "#/$defs/department", "$defs": {
             "department": _obj({"name": _s(), "budget": _n(0), "teams": _a(_ref("#/$defs/team"))},
                                ("name",)),
             "team": _obj({"name": _s(), "headcount": _i(0),
                           "subdepartments": _a(_ref("#/$defs/department"))},
                          ("name",))}},
         {"name": "R&D", "teams": [{"name": "Core"}]}),
        ("ui_component_tree",
         {"$ref": "#/$defs/component", "$defs": {
             "component": {"oneOf": [_ref("#/$defs/button"), _ref("#/$defs/label"),
                                     _ref("#/$defs/container")]},
             "button": _obj({"type": _const("button"), "text": _s(), "action": _s()}, ("type", "text"),
                            closed=True),
             "label": _obj({"type": _const("label"), "text": _s()}, ("type", "text"), closed=True),
             "container": _obj({"type": _const("container"), "layout": _e("row", "column", "grid"),
                                "children": _a(_ref("#/$defs/component"), max_items=10)}, ("type", "layout"),
                               closed=True)}},
         {"type": "container", "layout": "row", "children": [{"type": "label", "text": "Hi"}]}),
        ("sql_select_query_ast",
         {"$ref": "#/$defs/select", "$defs": {
             "select": _obj({"columns": _a(_p(r"^[a-z_][a-z0-9_]*$"), 1, 10),
                             "from": _p(r"^[a-z_][a-z0-9_]*$"), "where": _ref("#/$defs/condition"),
                             "limit": _i(1, 1000)}, ("columns", "from"),
                            closed=True),
             "condition": {"anyOf": [_ref("#/$defs/comparison"), _ref("#/$defs/logical"),
                                     _ref("#/$defs/membership")]},
             "comparison": _obj({"column": _s(), "op": _e("=", "!=", "<", ">", "<=", ">="),
                                 "value": comparison_value},
                                ("column", "op", "value"), closed=True),
             "logical": _obj({"op": _e("AND", "OR"), "conditions": _a(_ref("#/$defs/condition"))}, ("op",),
                             closed=True),
             "membership": _obj({"column": _s(), "op": _e("IN", "NOT IN"),
                                 "values": _a({"anyOf": [_s(), _n()]}), "subquery": _ref("#/$defs/select")},
                                ("column", "op"), closed=True)}},
         {"columns": ["id"], "from": "users"}),
        ("program_statement_ast",
         _obj({"statements": _a(_ref("#/$defs/statement"))}, ("statements",), **{"$defs": {
             "statement": {"oneOf": [_ref("#/$defs/assign"), _ref("#/$defs/if"), _ref("#/$defs/while")]},
             "assign": _obj({"kind": _const("assign"), "target": _p(r"^[a-z_][a-z0-9_]*$"), "expr": _s()},
                            ("kind", "target", "expr"), closed=True),
             "if": _obj({"kind": _const("if"), "condition": _s(), "then": _a(_ref("#/$defs/statement")),
                         "else": _a(_ref("#/$defs/statement"))}, ("kind", "condition"), closed=True),
             "while": _obj({"kind": _const("while"), "condition": _s(),
                            "body": _a(_ref("#/$defs/statement"))},
                           ("kind", "condition"), closed=True)}}),
         {"statements": [{"kind": "assign", "target": "x", "expr": "1"}]}),
    ]


# --- wide objects -------------------------------------------------------------------------------

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def _fields(type_schema: Schema, names: str) -> Schema:
    return dict.fromkeys(names.split(), type_schema)


def _wide_obj(required: tuple[str, ...], *groups: Schema, closed: bool = False) -> Schema:
    return _obj({name: schema for group in groups for name, schema in group.items()}, required, closed=closed)


def _wide() -> list[_Entry]:
    text, number, flag = _s(maxLength=80), _n(), _b()
    return [
        ("product_catalog_wide_attributes",
         _wide_obj(("sku", "title", "list_price", "active"),
                   _fields(text,
                           "sku title subtitle brand manufacturer model_number upc short_description "
                           "long_description material color finish print_pattern size_label "
                           "country_of_origin warranty_terms care_instructions category subcategory "
                           "department collection season target_audience style fit closure_type "
                           "power_source"),
                   _fields(_i(0),
                           "stock_quantity reorder_level max_order_quantity warranty_months pack_count "
                           "pieces_included wattage voltage min_age_months review_count lead_time_days"),
                   _fields(_n(0),
                           "list_price sale_price cost_price weight_kg length_cm width_cm height_cm "
                           "package_weight_kg package_length_cm package_width_cm package_height_cm "
                           "average_rating shipping_surcharge"),
                   _fields(flag,
                           "active assembly_required batteries_included batteries_required fragile "
                           "hazardous gift_wrap_available returnable taxable backorder_allowed")),
         {"sku": "T-100", "title": "Tent", "list_price": 199.0, "active": True}),
        ("employee_hr_record_wide",
         _wide_obj(("employee_number", "first_name", "last_name", "is_active"),
                   _fields(text,
                           "employee_number first_name middle_name last_name preferred_name job_title "
                           "job_code department division cost_center location_code office_building "
                           "desk_number work_phone mobile_phone personal_email_address work_email_address "
                           "manager_employee_number hire_date termination_date birth_date pronouns "
                           "nationality home_address_line1 home_address_line2 home_city home_region "
                           "home_postal_code home_country emergency_contact_name emergency_contact_phone"),
                   _fields(_i(0),
                           "grade_level weekly_hours vacation_days_total vacation_days_used sick_days_used "
                           "years_of_service direct_reports_count"),
                   _fields(_n(0),
                           "base_salary bonus_target_pct fte commission_rate stock_units_vested"),
                   _fields(flag,
                           "is_active is_contractor is_remote is_manager eligible_for_overtime "
                           "benefits_enrolled background_check_passed union_member"),
                   {"employment_type": _e("permanent", "fixed_term", "intern"),
                    "pay_frequency": _e("weekly", "biweekly", "monthly")}, closed=True),
         {"employee_number": "E1", "first_name": "Ann", "last_name": "Lee", "is_active": True}),
        ("vehicle_specification_wide",
         _wide_obj(("vin", "make", "model", "model_year"),
                   _fields(text,
                           "vin make model trim body_style drivetrain engine_code fuel_type "
                           "transmission_type exterior_color interior_color interior_material "
                           "tire_size_front tire_size_rear headlight_type infotainment_system "
                           "assembly_plant"),
                   _fields(_i(0),
                           "model_year doors seats cylinders displacement_cc horsepower torque_nm gears "
                           "airbag_count warranty_km warranty_years curb_weight_kg towing_capacity_kg "
                           "cargo_volume_l fuel_tank_l top_speed_kph"),
                   _fields(_n(0),
                           "zero_to_hundred_s fuel_consumption_l_per_100km co2_g_per_km length_mm width_mm "
                           "height_mm wheelbase_mm ground_clearance_mm battery_kwh electric_range_km msrp"),
                   _fields(flag,
                           "all_wheel_drive sunroof heated_seats adaptive_cruise lane_keep_assist "
                           "parking_sensors rear_camera tow_hitch apple_carplay android_auto")),
         {"vin": "1HGCM82633A004352", "make": "Honda", "model": "Accord", "model_year": 2003}),
        ("patient_intake_form_wide",
         _wide_obj(("medical_record_number", "first_name", "last_name", "date_of_birth", "consent_to_treat"),
                   _fields(text,
                           "medical_record_number first_name last_name preferred_language primary_phone "
                           "secondary_phone address_line city region postal_code insurance_provider "
                           "insurance_member_id insurance_group_number primary_physician "
                           "referring_physician reason_for_visit current_medications known_allergies "
                           "past_surgeries family_history emergency_contact_name emergency_contact_relation "
                           "emergency_contact_phone pharmacy_name occupation"),
                   {"date_of_birth": _f("date"), "visit_date": _f("date"), "email": _f("email"),
                    "sex": _e("female", "male", "intersex", "undisclosed"),
                    "blood_type": _e("A+", "A-", "B+", "B-", "AB+", "AB-", "O+", "O-", "unknown"),
                    "marital_status": _e("single", "married", "divorced", "widowed", "other"),
                    "height_cm": _i(30, 250), "weight_kg": _i(1, 400), "pain_level": _i(0, 10),
                    "temperature_c": _n(30, 45)},
                   _fields(_i(0, 100), "alcohol_drinks_per_week cigarettes_per_day exercise_days_per_week"),
                   _fields(flag,
                           "smoker pregnant diabetic hypertension asthma heart_condition vaccinated_flu "
                           "vaccinated_covid consent_to_treat consent_to_share_records "
                           "privacy_notice_acknowledged has_advance_directive needs_interpreter "
                           "uses_wheelchair"), closed=True),
         {"medical_record_number": "MRN1", "first_name": "Ida", "last_name": "Berg",
          "date_of_birth": "1980-02-29", "consent_to_treat": True}),
        ("storefront_feature_flags_wide",
         _wide_obj(("environment", "config_version"),
                   {"environment": _e("development", "staging", "production"), "config_version": _i(1)},
                   _fields(flag,
                           "new_checkout_flow dark_mode_default beta_dashboard search_autocomplete "
                           "search_spellcheck recommendations_v2 personalized_homepage one_click_reorder "
                           "guest_checkout apple_pay google_pay paypal_express buy_now_pay_later gift_cards "
                           "loyalty_points referral_program email_digest push_notifications sms_alerts "
                           "in_app_chat live_support_widget product_videos ar_preview size_recommender "
                           "wishlist_sharing price_drop_alerts back_in_stock_alerts multi_currency "
                           "auto_translate accessibility_mode high_contrast_theme reduced_motion "
                           "lazy_image_loading prefetch_links service_worker_cache offline_mode "
                           "two_factor_auth passwordless_login social_login captcha_on_signup "
                           "strict_rate_limits audit_logging gdpr_banner cookie_consent_v2 "
                           "maintenance_banner read_only_mode legacy_api_enabled graphql_api webhooks_v2 "
                           "bulk_export csv_import experimental_editor"), closed=True),
         {"environment": "staging", "config_version": 12}),
        ("rpg_character_sheet_wide",
         _wide_obj(("character_name", "character_class", "level"),
                   _fields(text,
                           "character_name player_name race character_class subclass background alignment "
                           "deity homeland languages_known personality_traits ideals bonds flaws backstory"),
                   {"level": _i(1, 20), "experience_points": _i(0)},
                   _fields(_i(1, 30), "strength dexterity constitution intelligence wisdom charisma"),
                   _fields(_i(0),
                           "armor_class initiative speed_ft max_hit_points current_hit_points "
                           "temporary_hit_points hit_dice_remaining proficiency_bonus passive_perception "
                           "gold_pieces silver_pieces copper_pieces inspiration_points"),
                   _fields(_i(0, 3), "death_save_successes death_save_failures"),
                   _fields(flag,
                           "prof_acrobatics prof_animal_handling prof_arcana prof_athletics prof_deception "
                           "prof_history prof_insight prof_intimidation prof_investigation prof_medicine "
                           "prof_nature prof_perception prof_performance prof_persuasion prof_religion "
                           "prof_sleight_of_hand prof_stealth prof_survival")),
         {"character_name": "Tamsin", "character_class": "rogue", "level": 3}),
        ("country_statistics_wide",
         _wide_obj(("country_name", "iso_alpha2", "population"),
                   _fields(text,
                           "country_name official_name iso_alpha2 iso_alpha3 capital_city continent "
                           "subregion currency_code currency_name calling_code top_level_domain "
                           "government_type head_of_state official_languages driving_side"),
                   _fields(_i(0),
                           "population area_km2 year_of_independence number_of_regions number_of_airports "
                           "military_personnel internet_users mobile_subscriptions unesco_sites"),
                   _fields(number,
                           "gdp_usd_billions gdp_per_capita_usd gdp_growth_pct inflation_pct "
                           "unemployment_pct life_expectancy_years median_age fertility_rate "
                           "literacy_rate_pct urban_population_pct forest_cover_pct co2_tonnes_per_capita "
                           "debt_to_gdp_pct gini_index human_development_index population_density_per_km2 "
                           "renewable_energy_pct health_spending_pct_gdp education_spending_pct_gdp "
                           "tourism_arrivals_millions exports_usd_billions imports_usd_billions"),
                   _fields(flag,
                           "landlocked un_member eu_member nato_member oecd_member g20_member "
                           "uses_metric_system island_nation")),
         {"country_name": "Iceland", "iso_alpha2": "IS", "population": 390000}),
        ("sensor_array_64_channels",
         _wide_obj(("device_id",), {"device_id": text, "sampled_at_ms": _i(0)},
                   {f"ch_{k:02d}": _n(-50, 150) for k in range(64)}, closed=True),
         {"device_id": "daq-1"}),
        ("customer_satisfaction_survey_55_questions",
         _wide_obj(("respondent_id",), {"respondent_id": text, "completed": flag},
                   {f"q{k:02d}": _i(1, 5) for k in range(1, 56)}, closed=True),
         {"respondent_id": "r-77", "q01": 4}),
        ("monthly_kpi_report_wide",
         _wide_obj(("year", "business_unit"), {"year": _i(2000, 2100), "business_unit": text},
                   {f"{metric}_{month}": _n(0) for metric in ("revenue", "costs", "new_customers",
                                                              "churned_customers",
                                                              "support_tickets") for month in _MONTHS}),
         {"year": 2024, "business_unit": "retail"}),
        ("weather_station_hourly_wide",
         _wide_obj(("station_id", "day"), {"station_id": _p(r"^[A-Z]{4}[0-9]{2}$"), "day": _f("date")},
                   *({f"{quantity}_h{h:02d}": schema for h in range(24)}
                     for quantity, schema in (("temp_c", _n(-90, 60)), ("humidity_pct", _i(0, 100)),
                                              ("wind_kph", _n(0, 400)))), closed=True),
         {"station_id": "KSEA01", "day": "2024-07-01"}),
        ("server_metrics_snapshot_wide",
         _wide_obj(("hostname", "collected_at_ms"), {"hostname": text},
                   _fields(_i(0),
                           "collected_at_ms mem_total_mb mem_used_mb swap_used_mb open_files process_count "
                           "thread_count uptime_s context_switches_per_s interrupts_per_s"),
                   _fields(_n(0),
                           "load_avg_1m load_avg_5m load_avg_15m disk_read_kbps disk_write_kbps net_rx_kbps "
                           "net_tx_kbps gpu_util_pct temperature_c"),
                   {f"cpu{core}_{mode}_pct": _n(0, 100) for core in range(8)
                    for mode in ("user", "system", "idle", "iowait")}),
         {"hostname": "web-3", "collected_at_ms": 1700000000000}),
    ]
