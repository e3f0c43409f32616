"""The process defaults set before torch loads (runtime/config/envs.py set_process_defaults)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from radixlm.kernels import isa
from radixlm.runtime.model.model_files import cache_dir

CODE = (
    "import json, os, radixlm.runtime.engine, torch;"
    "print(json.dumps({'aten': torch.backends.cpu.get_cpu_capability(),"
    " 'env': {k: os.environ.get(k) for k in ('ONEDNN_MAX_CPU_ISA', 'MKL_ENABLE_INSTRUCTIONS', 'GOMP_SPINCOUNT')}}))"
)


def _run(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RADIXLM_CPU_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env={**clean, **env},
                         check=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(("level", "aten", "onednn", "mkl"), [
    ("generic", "DEFAULT", "SSE41", "SSE4_2"),
    ("avx2", "AVX2", "AVX2", "AVX2"),
], ids=["generic", "avx2"])
def test_a_capped_level_caps_torch_too(level: str, aten: str, onednn: str, mkl: str) -> None:
    """RADIXLM_CPU_ISA below the machine also caps torch's own kernels (ATen, oneDNN, MKL), so a
    capped run uses nothing above the level anywhere. (x86 only: an ARM machine has no such caps;
    on a machine without AVX2, ATen stays below it whatever the cap says.)"""
    features = isa.probe(cache_dir() / "extensions")
    if level == "avx2" and (features is None or "avx2" not in features.present):
        aten = "DEFAULT"
    got = _run(RADIXLM_CPU_ISA=level)
    assert got == {"aten": aten, "env": {"ONEDNN_MAX_CPU_ISA": onednn, "MKL_ENABLE_INSTRUCTIONS": mkl,
                                         "GOMP_SPINCOUNT": "10000"}}


def test_uncapped_and_user_settings_are_kept() -> None:
    got = _run()
    assert got["env"] == {"ONEDNN_MAX_CPU_ISA": None, "MKL_ENABLE_INSTRUCTIONS": None, "GOMP_SPINCOUNT": "10000"}
    got = _run(RADIXLM_CPU_ISA="avx2", MKL_ENABLE_INSTRUCTIONS="AVX", GOMP_SPINCOUNT="5")
    assert got["env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX", "GOMP_SPINCOUNT": "5"}
