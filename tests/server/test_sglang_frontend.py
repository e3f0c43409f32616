"""The real `sglang` frontend package (its RuntimeEndpoint, unchanged) against our server.

sglang's full install pulls CUDA packages, so the test fetches the wheel with `pip download
--no-deps`, unpacks only `sglang/`, and installs the handful of pure-Python modules its frontend
imports into a side directory (cached under the radixlm cache); the program runs in a
subprocess with those on its path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ServerHandle

PROGRAM = r'''
import json, sys
sys.path.insert(0, sys.argv[2])
sys.path.append(sys.argv[3])
import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

@sgl.function
def qa(s, question):
    s += "Question: " + question + "\n"
    s += "Answer:" + sgl.gen("answer", max_tokens=8, temperature=0)
    s += "\nColour: " + sgl.select("colour", choices=["red", "green", "blue"])

sgl.set_default_backend(RuntimeEndpoint(sys.argv[1]))
state = qa.run(question="What is the sky like?")
streamed = qa.run(question="What is the sky like?", stream=True)
stream_text = "".join(streamed.text_iter())
batch = qa.run_batch([{"question": "a"}, {"question": "b"}])
print(json.dumps({
    "answer": state["answer"], "colour": state["colour"], "text": state.text(),
    "stream_text": stream_text, "batch": [b["colour"] for b in batch],
    "meta": state.get_meta_info("answer"),
}))
'''


def under_sglang_and_radixlm(program: str, url: str, sglang_paths: tuple[Path, Path]) -> list[dict[str, Any]]:
    """The JSON a program prints last, run by the real sglang frontend, then unchanged but for
    `import radixlm as sgl` (and radixlm's RuntimeEndpoint)."""
    pkg, deps = sglang_paths
    ours_program = program.replace("import sglang as sgl", "import radixlm as sgl").replace(
        "from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint", "from radixlm import RuntimeEndpoint")
    outs = []
    for source in (program, ours_program):
        done = subprocess.run([sys.executable, "-c", source, url, str(pkg), str(deps)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return outs


def test_the_same_program_under_import_radixlm_as_sgl(tiny_server: ServerHandle, sglang_paths: tuple[Path, Path]) -> None:
    """`import radixlm as sgl` runs the unchanged program and gives what sglang's frontend gives."""
    theirs, ours = under_sglang_and_radixlm(PROGRAM, tiny_server.url, sglang_paths)
    for key in ("answer", "text", "stream_text", "batch"):
        assert ours[key] == theirs[key], key
    assert ours["meta"]["completion_tokens"] == theirs["meta"]["completion_tokens"] == 8


def test_sglang_runtime_endpoint_runs_a_program(tiny_server: ServerHandle, sglang_paths: tuple[Path, Path]) -> None:
    pkg, deps = sglang_paths
    done = subprocess.run([sys.executable, "-c", PROGRAM, tiny_server.url, str(pkg), str(deps)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(out["answer"], str) and out["answer"]
    assert out["colour"] in ("red", "green", "blue") and all(c in ("red", "green", "blue") for c in out["batch"])
    assert out["text"].startswith("Question: What is the sky like?\nAnswer:" + out["answer"])
    assert out["stream_text"] == out["text"]  # greedy: streaming gives the same program text
    assert out["meta"]["completion_tokens"] == 8
