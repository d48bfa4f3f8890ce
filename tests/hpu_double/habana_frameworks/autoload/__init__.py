"""torch's device-backend autoload entry point (entry point group
``torch.backends``, ``device_backend = habana_frameworks.autoload:__autoload``,
bridge v1.19.0 python_packages/setup.py:91-94).

As in the bridge (autoload/__init__.py): PT_HPU_AUTOLOAD=1 or 0 decides; unset,
autoload is off in lazy mode (PT_HPU_LAZY_MODE, default 1) and on otherwise.
"""

import os

is_loaded = False


def is_autoload_enabled() -> bool:
    explicit = os.getenv("PT_HPU_AUTOLOAD", "-1")
    if explicit in ("0", "1"):
        return explicit == "1"
    return os.getenv("PT_HPU_LAZY_MODE", "1") != "1"


def __autoload() -> None:
    if is_loaded or not is_autoload_enabled():
        return
    import habana_frameworks.torch  # noqa: F401
