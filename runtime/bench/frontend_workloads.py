"""The frontend workloads F1-F4: fixed `@function` programs and their inputs, after the SGLang
paper's benchmark suite, sized for SmolLM2-135M on a CPU.

  F1  few-shot multiple choice (HellaSwag-style): 5 solved examples + a description, `select`
      among 4 endings; one program per question, run with `run_batch`
  F2  tree of thought: a question, `fork` into 3 ideas (a gen each), `join`, then a `select`
      judging them
  F3  multi-turn chat: conversations of several user turns, each answered by a gen, all sharing
      one system prompt
  F4  JSON extraction: W4's passages, one gen under W4's JSON schema per passage (`run_batch`)

The programs' inputs (F1's descriptions and endings, F2's questions, F3's turns and topics) are
data, data/frontend_workloads.json; F4 takes W4's passages.

Everything is deterministic (fixed texts, a seeded shuffle) and decoding is greedy, so two
systems running these programs should give the same outputs. Each builder takes its size, so a
test can run a tiny configuration of the same programs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import radixlm as rl
from radixlm.runtime.bench import workloads as wl
from radixlm.runtime.bench.data_files import load_json

_DATA = load_json("frontend_workloads.json")


@dataclass
class FrontendWorkload:
    name: str
    title: str
    program: rl.SglFunction
    batch: list[dict[str, Any]]  # one dict of program arguments per program instance
    output_names: list[str]  # the variables compared across systems
    # optional: a summary of the outputs' quality (list of per-program outputs -> short text)
    check: Callable[[list[dict[str, Any]]], str] | None = None


# ---------------------------------------------------------------- F1 few-shot multiple choice
# [description, its plausible ending]; the first F1_NUM_SHOTS are the solved examples, and each
# question's wrong endings are the right endings of other questions (HellaSwag-style distractors).
_ACTIVITIES = _DATA["f1_activities"]
F1_NUM_SHOTS = 5
F1_NUM_CHOICES = 4
F1_HEADER = "Each description below is completed with its most plausible ending.\n\n"


def f1_few_shot() -> str:
    shots = [f"{context} {ending}" for context, ending in _ACTIVITIES[:F1_NUM_SHOTS]]
    return F1_HEADER + "\n\n".join(shots) + "\n\n"


def f1_questions(num_questions: int) -> list[dict[str, Any]]:
    """Program arguments: the description, 4 endings (with a leading space) and the answer index."""
    rng = random.Random(wl.SEED + 11)
    pool = _ACTIVITIES[F1_NUM_SHOTS:]
    if num_questions > len(pool):
        raise ValueError(f"F1 has {len(pool)} questions")
    out = []
    for i, (context, ending) in enumerate(pool[:num_questions]):
        wrong = rng.sample([e for j, (_, e) in enumerate(pool) if j != i], F1_NUM_CHOICES - 1)
        endings = [ending, *wrong]
        rng.shuffle(endings)
        out.append({"question": context, "endings": [" " + e for e in endings], "answer": endings.index(ending)})
    return out


@rl.function
def few_shot_choice(s: Any, question: str, endings: list[str], answer: int = -1) -> None:
    s += f1_few_shot() + question
    s += rl.select("ending", choices=endings)


def _f1_check(outputs: list[dict[str, Any]], questions: list[dict[str, Any]]) -> str:
    right = sum(o["ending"] == q["endings"][q["answer"]] for o, q in zip(outputs, questions))
    return f"accuracy {right}/{len(questions)}"


def f1_workload(num_questions: int = 16) -> FrontendWorkload:
    questions = f1_questions(num_questions)
    return FrontendWorkload(
        "F1", f"few-shot multiple choice, {num_questions} questions x {F1_NUM_CHOICES} endings (select)",
        few_shot_choice, questions, ["ending"], lambda outputs: _f1_check(outputs, questions),
    )


# ---------------------------------------------------------------- F2 tree of thought
F2_SYSTEM = "You are a practical assistant. You think of several different ideas before choosing one."
F2_QUESTIONS = _DATA["f2_questions"]
F2_OPENERS = ["One idea is to", "Another idea is to", "A third idea is to"]  # one per branch


@rl.function
def tree_of_thought(s: Any, question: str, branch_tokens: int = 24) -> None:
    s += rl.system(F2_SYSTEM)
    s += rl.user(question)
    s += rl.assistant_begin()
    forks = s.fork(len(F2_OPENERS))
    for opener, branch in zip(F2_OPENERS, forks):
        branch += opener + rl.gen("idea", max_tokens=branch_tokens, stop="\n")
    forks.join()
    s += "".join(f"{i + 1}. {opener}{idea}\n" for i, (opener, idea) in enumerate(zip(F2_OPENERS, s["idea"])))
    s += rl.assistant_end()
    s += rl.user("Which idea is the most practical? Answer with its number only.")
    s += rl.assistant(rl.select("best", choices=[str(i + 1) for i in range(len(F2_OPENERS))]))


def f2_workload(num_questions: int = 4, branch_tokens: int = 24) -> FrontendWorkload:
    if num_questions > len(F2_QUESTIONS):
        raise ValueError(f"F2 has {len(F2_QUESTIONS)} questions")
    batch = [{"question": q, "branch_tokens": branch_tokens} for q in F2_QUESTIONS[:num_questions]]
    return FrontendWorkload(
        "F2", f"tree of thought, {num_questions} questions x fork {len(F2_OPENERS)} x {branch_tokens} tokens + select",
        tree_of_thought, batch, ["idea", "best"],
    )


# ---------------------------------------------------------------- F3 multi-turn chat
F3_SYSTEM = (
    "You are a friendly assistant in a chat about everyday topics. Keep every answer short, at most "
    "two sentences, and build on what was said earlier in the conversation."
)
F3_TURNS = _DATA["f3_turns"]  # {topic}: the conversation's
F3_TOPICS = _DATA["f3_topics"]


@rl.function
def multi_turn_chat(s: Any, turns: list[str], turn_tokens: int = 24) -> None:
    s += rl.system(F3_SYSTEM)
    for i, text in enumerate(turns):
        s += rl.user(text)
        s += rl.assistant(rl.gen(f"answer_{i}", max_tokens=turn_tokens))


def f3_workload(num_conversations: int = 8, num_turns: int = 4, turn_tokens: int = 24) -> FrontendWorkload:
    if num_conversations > len(F3_TOPICS) or num_turns > len(F3_TURNS):
        raise ValueError(f"F3 has {len(F3_TOPICS)} conversations of up to {len(F3_TURNS)} turns")
    batch = [
        {"turns": [t.format(topic=topic) for t in F3_TURNS[:num_turns]], "turn_tokens": turn_tokens}
        for topic in F3_TOPICS[:num_conversations]
    ]
    return FrontendWorkload(
        "F3", f"multi-turn chat, {num_conversations} conversations x {num_turns} turns x {turn_tokens} tokens",
        multi_turn_chat, batch, [f"answer_{i}" for i in range(num_turns)],
    )


# ---------------------------------------------------------------- F4 JSON extraction
def _w4_user_text(prompt: str) -> str:
    return prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


@rl.function
def extract_json(s: Any, passage_request: str, max_tokens: int = wl.W4_MAX_TOKENS) -> None:
    s += rl.system(wl.DEFAULT_SYSTEM)
    s += rl.user(passage_request)
    s += rl.assistant(rl.gen("json", max_tokens=max_tokens, json_schema=wl.W4_SCHEMA))


def _f4_check(outputs: list[dict[str, Any]], truths: list[dict[str, Any]]) -> str:
    checks = [wl.w4_check(o["json"], t) for o, t in zip(outputs, truths)]
    valid = sum(c[1] for c in checks)
    exact = sum(c[2] for c in checks)
    return f"valid {valid}/{len(checks)}, exact fields {exact}/{4 * len(checks)}"


def f4_workload(num_passages: int = 16, max_tokens: int = wl.W4_MAX_TOKENS) -> FrontendWorkload:
    cases = wl.w4_cases()[:num_passages]
    batch = [{"passage_request": _w4_user_text(c["prompt"]), "max_tokens": max_tokens} for c in cases]
    truths = [c["truth"] for c in cases]
    return FrontendWorkload(
        "F4", f"JSON extraction, {num_passages} W4 passages (gen with json_schema)",
        extract_json, batch, ["json"], lambda outputs: _f4_check(outputs, truths),
    )


FRONTEND_WORKLOADS: dict[str, Callable[..., FrontendWorkload]] = {
    "F1": f1_workload, "F2": f2_workload, "F3": f3_workload, "F4": f4_workload,
}
