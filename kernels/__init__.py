"""Compute kernels (Triton) and the torch references they are tested against. No scheduling logic.

Installed, this folder is `radixlm.kernels`. Run from the checkout (`python -m ...`, pytest), the
checkout's root is on `sys.path`, so `import kernels` would find this folder before Hugging Face's
`kernels` package, which transformers (>= 5.25) imports when its metadata says it is installed.
Imported under that top-level name, this module hands the import the installed package instead.
"""

import sys

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os

    _checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _checkout]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _others)
    if _spec is not None and _spec.loader is not None:
        _installed = importlib.util.module_from_spec(_spec)
        sys.modules["kernels"] = _installed  # what the import statement returns
        _spec.loader.exec_module(_installed)
