"""habana_frameworks.torch.utils.internal (bridge v1.19.0 utils/internal.py)."""

import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


def is_lazy() -> bool:
    """Lazy mode unless PT_HPU_LAZY_MODE is "0"; read once (internal.py:25-28:
    the published default is lazy)."""
    if is_lazy._is_lazy is None:  # type: ignore[attr-defined]
        is_lazy._is_lazy = os.getenv("PT_HPU_LAZY_MODE", "1") != "0"  # type: ignore[attr-defined]
    return is_lazy._is_lazy  # type: ignore[attr-defined]


is_lazy._is_lazy = None  # type: ignore[attr-defined]


def lazy_only(func: Callable[..., Any]) -> Callable[..., None]:
    """Runs ``func`` in lazy mode; in eager mode a no-op taking any arguments,
    as the bridge's decorator (internal.py:34-47)."""

    def lazy_wrapper(*args: Any, **kwargs: Any) -> None:
        func(*args, **kwargs)

    def non_lazy_wrapper(*args: Any, **kwargs: Any) -> None:
        return None

    lazy_wrapper.__wrapped__ = func  # type: ignore[attr-defined]
    non_lazy_wrapper.__wrapped__ = func  # type: ignore[attr-defined]

    if is_lazy():
        return lazy_wrapper
    logger.warning(
        "Calling %s function does not have any effect. It's lazy mode only "
        "functionality. (warning logged once)",
        func.__name__,
    )
    return non_lazy_wrapper
