"""Weights in huge pages (kernels/huge_pages.py) and in one allocation in decode order
(linear_method.in_one_arena): same values, the pages the OS gives, the order the step reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixlm.kernels import huge_pages


def _thp_mode() -> str:
    """The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ('' off Linux)."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""
    return text[text.index("[") + 1: text.index("]")]


def _huge_kib_at(address: int) -> int:
    """AnonHugePages (kB) of this process's mapping that holds `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(a, 16) for a in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("shape", [(3, 5), (64, 1024), (4, 1024, 1024)])
def test_copy_keeps_values_shape_and_dtype(shape: tuple[int, ...]) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        src = (torch.randn(shape) * 50).to(dtype)
        out = huge_pages.copy(src)
        assert out.dtype == dtype and out.shape == src.shape and out.is_contiguous()
        assert torch.equal(out, src)
        assert out.data_ptr() != src.data_ptr()


def test_a_large_tensor_gets_huge_pages_where_the_os_gives_them() -> None:
    if _thp_mode() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {_thp_mode() or 'absent'} on this OS")
    t = huge_pages.copy(torch.ones(16 << 20, dtype=torch.uint8))  # 16 MB: at least 7 aligned 2 MB pages
    assert _huge_kib_at(t.data_ptr()) >= 2048


def test_the_model_reads_its_kernel_weights_from_one_allocation_in_step_order(tiny_model_dir: Path) -> None:
    """Every kernel weight (layers in order, then the lm_head) lies in one storage, ascending,
    each at a 4 KB boundary; the engine answers from them as before (greedy equal to torch ops)."""
    from radixlm.runtime.engine import Engine

    prompt_ids = list(range(100, 112))
    outputs = {}
    for name, kwargs in {"torch": {"disable_cpu_kernels": True}, "kernels": {}}.items():
        engine = Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=512, random_seed=0, **kwargs)
        try:
            if name == "kernels":
                model = engine.runner.model
                linears = [lin for layer in model.layers for lin in (layer.qkv_proj, layer.o_proj,
                                                                     layer.gate_up_proj, layer.down_proj)]
                packed = [lin.method.packed for lin in [*linears, model.lm_head]]
                storage = packed[0].untyped_storage().data_ptr()
                assert all(p.untyped_storage().data_ptr() == storage for p in packed)
                addresses = [p.data_ptr() for p in packed]
                assert addresses == sorted(addresses) and all(a % 4096 == 0 for a in addresses)
            out = engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": 8, "temperature": 0})
            outputs[name] = out["output_ids"] if "output_ids" in out else out["text"]
        finally:
            engine.shutdown()
    assert outputs["kernels"] == outputs["torch"]
