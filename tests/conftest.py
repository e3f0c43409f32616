"""Suite-wide setup. Triton runs in its interpreter on CPU tensors (no GPU here): the variable
must be set before anything imports triton."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
