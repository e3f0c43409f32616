"""Packaging: one `radixlm` import package over lang/, runtime/ and kernels/; the language
imports without torch."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_radixlm_does_not_import_torch() -> None:
    out = run_python("import sys, radixlm; print('torch' in sys.modules, radixlm.__version__)")
    assert out.startswith("False ")


def test_subpackages_map_onto_the_three_folders() -> None:
    out = run_python(
        "import radixlm, radixlm.runtime, radixlm.kernels;"
        "print(radixlm.__file__); print(radixlm.runtime.__file__); print(radixlm.kernels.__file__)"
    )
    lang, runtime, kernels = out.splitlines()
    assert lang.endswith("lang/__init__.py")
    assert runtime.endswith("runtime/__init__.py")
    assert kernels.endswith("kernels/__init__.py")


def test_engine_is_reachable_lazily() -> None:
    out = run_python(
        "import sys, radixlm; from radixlm.runtime import Engine as A; print(radixlm.Engine is A, 'torch' in sys.modules)"
    )
    assert out == "True True"


def test_every_package_folder_is_listed_for_setuptools() -> None:
    """pyproject lists packages by hand (three folders map onto one package): a forgotten
    subpackage would be missing from a plain (non-editable) install."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    mapping = {"lang": "radixlm", "runtime": "radixlm.runtime", "kernels": "radixlm.kernels"}
    found = set()
    for folder, package in mapping.items():
        for init in (root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(root / folder)
            found.add(".".join([package, *rel.parts]))
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
