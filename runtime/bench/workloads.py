"""The fixed benchmark workloads W1-W5: the workloads of ../shared/bench/workloads.py, so that our
figures use byte-identical prompts to the peer measurements (transformers, llama.cpp).
Deterministic: prompts come from fixed word lists and a fixed seed. The word lists, sentences and
passage templates are data (data/workloads.json); the builders are here.
tests/runtime/test_bench_workloads.py pins the prompts' digest."""
import json
import random

from radixlm.runtime.bench.data_files import load_json

SEED = 1234
_DATA = load_json("workloads.json")

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(user, system=DEFAULT_SYSTEM):
    """ChatML exactly as SmolLM2's chat template renders it, with the generation prompt."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


# ---------------------------------------------------------------- W1
W1_NEW_TOKENS = 128
W1_PROMPT = chatml("Write a short story about a robot who learns to paint.",
                   system="You are a helpful assistant.")

# ---------------------------------------------------------------- W2
W2_NEW_TOKENS = 64
_TOPICS = _DATA["w2_topics"]  # topic -> its sentences
_TASKS = _DATA["w2_tasks"]


def w2_prompts():
    rng = random.Random(SEED)
    out = []
    topics = list(_TOPICS)
    for i in range(32):
        topic = topics[i % len(topics)]
        task = _TASKS[i // len(topics)]
        sents = list(_TOPICS[topic])
        rng.shuffle(sents)
        k = rng.randint(5, 7)
        out.append(chatml(f"{task}\n\nNotes about {topic}:\n" + " ".join(sents[:k])))
    return out


# ---------------------------------------------------------------- W3
W3_NEW_TOKENS = 16
_FIRST = _DATA["first_names"]
_LAST = _DATA["last_names"]
_DEPTS = _DATA["departments"]
_CITIES = _DATA["cities"]
_W3_QUESTIONS = _DATA["w3_questions"]  # {n}: a name, {d}: a department


def _directory(rng, n):
    people = []
    seen = set()
    while len(people) < n:
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        if name in seen:
            continue
        seen.add(name)
        people.append({"name": name, "dept": rng.choice(_DEPTS), "city": rng.choice(_CITIES),
                       "year": rng.randint(2008, 2024), "ext": rng.randint(1000, 9999)})
    return people


def w3_workload():
    """Returns (shared_prefix_text, [32 full prompts]). Every prompt starts with the prefix."""
    rng = random.Random(SEED + 3)
    people = _directory(rng, 30)
    rows = "\n".join(f"- {p['name']}: department {p['dept']}, office in {p['city']}, joined {p['year']}, "
                     f"extension {p['ext']}" for p in people)
    shots = []
    for p in people[:5]:
        shots.append(f"Q: Which department does {p['name']} work in and where is their office?\n"
                     f"A: {p['name']} works in {p['dept']} at the {p['city']} office.")
    system = ("You answer questions about the Acme Corporation staff directory. Answer in one short sentence "
              "using only the directory.\n\nStaff directory:\n" + rows +
              "\n\nExamples:\n" + "\n\n".join(shots))
    questions = []
    for i in range(32):
        p = people[5 + (i % 25)]
        t = _W3_QUESTIONS[i % len(_W3_QUESTIONS)]
        questions.append(t.format(n=p["name"], d=rng.choice(_DEPTS)))
    prefix = f"<|im_start|>system\n{system}<|im_end|>\n"
    prompts = [prefix + f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n" for q in questions]
    return prefix, prompts


# ---------------------------------------------------------------- W4
W4_MAX_TOKENS = 96
W4_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "email": {"type": "string"},
    },
    "required": ["name", "age", "city", "email"],
    "additionalProperties": False,
}
_W4_TEMPLATES = _DATA["w4_passages"]  # {name}, {age}, {city}, {email}


def w4_cases():
    rng = random.Random(SEED + 4)
    cases = []
    for i in range(16):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        name = f"{first} {last}"
        age = rng.randint(22, 67)
        city = rng.choice(_CITIES)
        email = f"{first.lower()}.{last.lower()}@example.{rng.choice(['com', 'org', 'net'])}"
        passage = _W4_TEMPLATES[i % len(_W4_TEMPLATES)].format(name=name, age=age, city=city, email=email)
        user = ("Extract the person's name, age, city and email address from the passage below. "
                "Reply with a JSON object with the keys name, age, city and email.\n\n"
                f"Passage: {passage}")
        cases.append({"prompt": chatml(user),
                      "truth": {"name": name, "age": age, "city": city, "email": email}})
    return cases


def w4_valid(obj):
    """Validates against W4_SCHEMA without third-party packages (both virtualenvs can run it)."""
    if not isinstance(obj, dict) or set(obj) != set(W4_SCHEMA["required"]):
        return False
    return (all(isinstance(obj[k], str) for k in ("name", "city", "email"))
            and isinstance(obj["age"], int) and not isinstance(obj["age"], bool))


def w4_first_object(text):
    """Lenient extraction for unconstrained output: the first JSON value that starts at a '{'."""
    i = text.find("{")
    if i < 0:
        return text
    try:
        obj, end = json.JSONDecoder().raw_decode(text[i:])
        return text[i:i + end]
    except Exception:
        return text[i:]


def w4_check(text, truth):
    """Returns (parses, validates, exact_fields)."""
    try:
        obj = json.loads(text)
    except Exception:
        return False, False, 0
    exact = sum(1 for k in truth if isinstance(obj, dict) and obj.get(k) == truth[k])
    return True, w4_valid(obj), exact


# ---------------------------------------------------------------- W5
W5_TOKENS = 2000


def w5_text():
    """Long text; each system takes the first W5_TOKENS tokens of it."""
    body = "\n\n".join(p.split("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0] for p in w2_prompts())
    body += "\n\n" + w3_workload()[0]
    return "<|im_start|>user\nRead all of the following material carefully.\n\n" + body
