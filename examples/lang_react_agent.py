"""A ReAct-style agent with two Python tools: think, decide, call a tool, observe, ..., answer.

Each step the model writes a thought (`gen`), then decides between calling a tool and answering
(`select`). A call is `gen(tools=[...], tool_choice="required")`: the arguments are generated
under the JSON schema derived from the chosen function's signature, so `s["call_N"]` is always a
valid `rl.ToolCall`; `s.run_tool("call_N")` runs the function and appends its result as a `tool`
message. The number of steps is bounded, the agent consults a tool at least `--min-tool-calls`
times before it may answer (questions here need arithmetic or a conversion), and a call that
repeats an earlier one ends the loop (it would observe nothing new).

    python examples/lang_react_agent.py [--url http://127.0.0.1:30000] [question]

Sample output (SmolLM2-135M-Instruct, `make serve`):

    question: It is 30 degrees celsius outside. What is that in fahrenheit?
    step 1
      thought: 30 degrees celsius is equal to 30 degrees celsius.
      action: call a tool (required first)
      tool call: convert_units {"value": 30, "from_unit": "celsius", "to_unit": "fahrenheit"}
      observation: 30 celsius = 86.0 fahrenheit
    step 2
      thought: 30 degrees celsius is equal to 86.0 degrees celsius.
      action: call a tool
      tool call: convert_units {"value": 30, "from_unit": "celsius", "to_unit": "fahrenheit"}
      (the same call as before: not run again)
    answer: 86.0 fahrenheit

(this small model picks good tool calls but seldom decides on its own that it is done: the
repeated-call rule is what ends its loop)
"""

from __future__ import annotations

import argparse
import json
import operator
from typing import Literal

import radixlm as rl

Unit = Literal["km", "mile", "kg", "pound", "celsius", "fahrenheit"]
_TO_BASE = {"km": 1.0, "mile": 1.609344, "kg": 1.0, "pound": 0.45359237}
_KIND = {"km": "length", "mile": "length", "kg": "mass", "pound": "mass", "celsius": "temperature",
         "fahrenheit": "temperature"}
_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def calculate(a: float, op: Literal["+", "-", "*", "/"], b: float) -> str:
    """Compute `a op b` for one arithmetic operation.

    Args:
        a: the left operand
        op: the operation
        b: the right operand
    """
    if op == "/" and b == 0:
        return "error: division by zero"
    return f"{a} {op} {b} = {round(_OPERATIONS[op](a, b), 6)}"


def convert_units(value: float, from_unit: Unit, to_unit: Unit) -> str:
    """Convert a quantity between units of length (km, mile), mass (kg, pound) or temperature.

    Args:
        value: the quantity in from_unit
        from_unit: the unit of value
        to_unit: the unit to convert to
    """
    if _KIND[from_unit] != _KIND[to_unit]:
        return f"error: cannot convert {_KIND[from_unit]} ({from_unit}) to {_KIND[to_unit]} ({to_unit})"
    if from_unit == to_unit:
        result = value
    elif from_unit == "celsius":
        result = value * 9 / 5 + 32
    elif from_unit == "fahrenheit":
        result = (value - 32) * 5 / 9
    else:
        result = value * _TO_BASE[from_unit] / _TO_BASE[to_unit]
    return f"{value} {from_unit} = {round(result, 4)} {to_unit}"


TOOLS = [calculate, convert_units]
QUESTION = "It is 30 degrees celsius outside. What is that in fahrenheit?"


@rl.function
def react_agent(s: rl.ProgramState, question: str, max_steps: int, min_tool_calls: int) -> None:
    s += rl.system("You answer questions by thinking step by step and using tools.\n\n" + rl.tools_prompt(TOOLS))
    s += rl.user(question)
    calls_made: list[tuple[str, dict[str, object]]] = []
    for step in range(max_steps):
        s += rl.assistant_begin()
        s += "Thought: " + rl.gen(f"thought_{step}", stop="\n") + "\n"
        if step < min_tool_calls:
            s += "Action: call a tool\n"  # not the model's choice yet: the policy wants an observation first
        else:
            s += "Action: " + rl.select(f"action_{step}", choices=["call a tool", "answer"]) + "\n"
            if s[f"action_{step}"] == "answer":
                break
        s += rl.gen(f"call_{step}", tools=TOOLS, tool_choice="required", max_tokens=64)
        call = s[f"call_{step}"]  # an rl.ToolCall: name and arguments, validated
        if (call.name, call.arguments) in calls_made:  # nothing new to observe: answer instead
            s += "\n"
            break
        calls_made.append((call.name, call.arguments))
        s += rl.assistant_end()
        s[f"observation_{step}"] = s.run_tool(f"call_{step}")  # also appended as a `tool` message
    else:
        s += rl.assistant_begin()  # out of steps: answer with what the tools gave
    s += "Answer: " + rl.gen("answer", stop="\n")
    s += rl.assistant_end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--min-tool-calls", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48, help="for thoughts and the answer")
    args = parser.parse_args()
    rl.set_default_backend(rl.RuntimeEndpoint(args.url))

    state = react_agent.run(question=args.question, max_steps=args.max_steps, min_tool_calls=args.min_tool_calls,
                            max_tokens=args.max_tokens, temperature=0)
    print("question:", args.question)
    for step in range(args.max_steps):
        if f"thought_{step}" not in state:
            break
        print(f"step {step + 1}")
        print("  thought:", state[f"thought_{step}"].strip())
        print("  action:", state[f"action_{step}"] if f"action_{step}" in state else "call a tool (required first)")
        if f"call_{step}" in state:
            call = state[f"call_{step}"]
            print(f"  tool call: {call.name} {json.dumps(call.arguments)}")
            if f"observation_{step}" in state:
                print(f"  observation: {state[f'observation_{step}']}")
            else:
                print("  (the same call as before: not run again)")
    print("answer:", state["answer"].strip())


if __name__ == "__main__":
    main()
