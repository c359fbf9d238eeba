"""The bf16 kernels' skip mark and checks, defined once for every test file that needs the kernels.

``needs_kernels`` and ``HAS_KERNELS`` are made when a test file imports them (asking for the kernels builds them
where they are missing: a file that needs them only in some cases calls ``require_kernels()`` or ``has_kernels()``
inside its tests instead, so that collecting it builds nothing).
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.decoding import cpu_kernels


def has_kernels() -> bool:
    """Whether the bf16 CPU kernels run here (built on first call where this CPU can run them)."""
    return cpu_kernels.kernels() is not None


def kernels_reason() -> str:
    """Why a test needing the bf16 CPU kernels is skipped here."""
    return f"bf16 kernels unavailable here: {cpu_kernels.kernels_unavailable_reason()}"


def require_kernels() -> None:
    """Inside a test (a parametrised case that needs them, a test that patches the machine): skip without the
    kernels, asked at call time."""
    if not has_kernels():
        pytest.skip(kernels_reason())


def __getattr__(name: str) -> Any:
    if name == "HAS_KERNELS":
        return has_kernels()
    if name == "needs_kernels":
        return pytest.mark.skipif(not has_kernels(), reason=kernels_reason())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
