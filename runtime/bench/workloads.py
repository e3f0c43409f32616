"""The fixed benchmark workloads W1-W5: the data of ../shared/bench/workloads.py, copied so that
our figures use byte-identical prompts to the peer measurements (transformers, llama.cpp).
Deterministic: prompts come from fixed word lists and a fixed seed."""
import json
import random

SEED = 1234

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
_TOPICS = {
    "bees": [
        "Honey bees live in colonies that can hold tens of thousands of workers during the summer months.",
        "A single queen lays nearly all of the eggs, sometimes more than a thousand in one day.",
        "Workers communicate the direction and distance of flowers with a figure-eight waggle dance.",
        "Forager bees visit hundreds of flowers on each trip and carry pollen in baskets on their legs.",
        "In winter the colony clusters together and shivers its flight muscles to keep the queen warm.",
        "Beekeepers harvest surplus honey but must leave enough stores for the colony to survive the cold.",
        "Pesticides, parasites such as the varroa mite, and habitat loss have all reduced bee numbers.",
    ],
    "railways": [
        "The first public steam railway opened in the north of England in the early nineteenth century.",
        "Standard gauge track places the rails just over one point four metres apart.",
        "Signalling systems divide a line into blocks so that only one train occupies each block at a time.",
        "Electric trains draw power from overhead wires or from a third rail beside the running rails.",
        "High-speed lines use gentle curves and dedicated tracks so trains can exceed three hundred kilometres per hour.",
        "Freight railways move bulk goods such as coal, grain and containers far more efficiently than trucks.",
        "Night trains are returning in Europe as travellers look for alternatives to short-haul flights.",
    ],
    "bread": [
        "Bread dough is made from flour, water, salt and a leavening agent such as yeast or sourdough starter.",
        "Kneading develops gluten, a stretchy network of proteins that traps the gas produced by yeast.",
        "A long, cool fermentation gives the loaf more flavour than a quick rise in a warm kitchen.",
        "Bakers shape the dough to build surface tension, which helps the loaf rise upward in the oven.",
        "Steam during the first minutes of baking keeps the crust soft so the bread can expand fully.",
        "The brown crust forms through the Maillard reaction between sugars and proteins at high heat.",
        "Cooling the loaf on a rack lets moisture escape so the crumb sets instead of turning gummy.",
    ],
    "volcanoes": [
        "Volcanoes form where molten rock from the mantle reaches the surface of the Earth.",
        "Most active volcanoes sit along the edges of tectonic plates, especially around the Pacific Ocean.",
        "Runny basalt lava produces gentle eruptions, while sticky lava rich in silica can explode violently.",
        "Ash clouds from large eruptions can ground aircraft across entire continents for days.",
        "Volcanic soil is often very fertile, which is why farms and towns grow on the slopes of volcanoes.",
        "Scientists watch for small earthquakes, ground swelling and gas emissions to forecast eruptions.",
        "Some islands, such as Hawaii, were built entirely by eruptions over a hotspot in the mantle.",
    ],
    "chess": [
        "Chess is played on a board of sixty-four squares by two players who control sixteen pieces each.",
        "The goal is to checkmate the opposing king so that it cannot escape capture.",
        "Opening principles include controlling the centre, developing pieces quickly and castling early.",
        "The knight is the only piece that can jump over other pieces, moving in an L shape.",
        "Endgames with few pieces left reward precise calculation and an active king.",
        "Computer engines now play far stronger than any human and are used widely for preparation.",
        "Rapid and blitz formats give each player only a few minutes for the entire game.",
    ],
    "solar": [
        "Solar panels turn sunlight into electricity using layers of silicon that release electrons when light hits them.",
        "The cost of solar modules has fallen by roughly ninety percent over the last fifteen years.",
        "Panels produce direct current, so an inverter converts it to alternating current for the home.",
        "Output depends on the angle of the panels, the season, the weather and any shading from trees.",
        "Batteries let households store midday energy and use it in the evening when demand peaks.",
        "Large solar farms can cover hundreds of hectares and supply power to entire cities.",
        "Old panels contain glass, aluminium and silver that recycling plants are learning to recover.",
    ],
    "sleep": [
        "Adults generally need between seven and nine hours of sleep each night to feel rested.",
        "Sleep moves through cycles of light sleep, deep sleep and rapid eye movement sleep.",
        "Deep sleep helps the body repair tissue, while dreaming sleep supports memory and learning.",
        "Bright screens late at night can delay the release of melatonin, the hormone that signals bedtime.",
        "Keeping a regular schedule, even on weekends, makes it easier to fall asleep quickly.",
        "Caffeine can stay in the body for many hours, so an afternoon coffee may disturb sleep.",
        "Long-term lack of sleep is linked to weaker immunity, poor concentration and weight gain.",
    ],
    "libraries": [
        "Public libraries lend books, films and music free of charge to anyone with a library card.",
        "Many libraries now offer computers, internet access and help with job applications.",
        "Children's story hours introduce young readers to books and to the habit of visiting the library.",
        "Librarians organise collections with classification systems so that related books sit together.",
        "Digital lending lets members borrow electronic books and audiobooks from home.",
        "Libraries also serve as quiet study spaces and as meeting rooms for local groups.",
        "Funding cuts have forced some towns to shorten opening hours or close smaller branches.",
    ],
}
_TASKS = [
    "Summarize the following notes in three sentences.",
    "List the three most important facts from these notes as bullet points.",
    "Explain these notes to a ten-year-old in simple words.",
    "Write a catchy title and a one-paragraph introduction based on these notes.",
]


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
_FIRST = ["Maria", "James", "Aiko", "Omar", "Lena", "Carlos", "Priya", "Tom", "Fatima", "Ivan",
          "Grace", "Mateo", "Nina", "Samuel", "Yuki", "Hannah", "Kwame", "Sofia", "Liam", "Elena"]
_LAST = ["Lopez", "Carter", "Tanaka", "Haddad", "Fischer", "Silva", "Nair", "Becker", "Khan", "Petrov",
         "Okafor", "Rossi", "Novak", "Dubois", "Kim", "Jensen", "Mensah", "Costa", "Walsh", "Moreau"]
_DEPTS = ["Finance", "Engineering", "Marketing", "Legal", "Support", "Design", "Sales", "Research"]
_CITIES = ["Lisbon", "Toronto", "Osaka", "Nairobi", "Berlin", "Denver", "Lyon", "Melbourne", "Austin", "Oslo"]


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
    templates = [
        "Which department does {n} work in and where is their office?",
        "In what year did {n} join the company, according to the directory?",
        "What is the phone extension of {n}, and which city is their office in?",
        "Does {n} work in the {d} department? Answer yes or no, then explain.",
    ]
    questions = []
    for i in range(32):
        p = people[5 + (i % 25)]
        t = templates[i % len(templates)]
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
_W4_TEMPLATES = [
    "{name}, who is {age} years old, moved to {city} last spring to start a new job at a small design studio. "
    "She loves cycling along the river on weekends. Colleagues can reach her at {email} for project questions.",
    "At the community meeting in {city}, {name} ({age}) spoke about plans for a new public garden near the station. "
    "Anyone who wants to volunteer was asked to write to {email} before the end of the month.",
    "Our new support engineer is {name}. He is {age}, lives in {city}, and previously worked on billing systems "
    "for an online shop. Customers with urgent issues should email {email} directly.",
    "Please welcome {name} to the research team. At {age}, {name} has already published two papers on soil "
    "chemistry. Based in {city}, {name} prefers to be contacted at {email} rather than by phone.",
]


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
