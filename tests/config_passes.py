"""The pass vLLM's engine core runs over the config it was sent.

vLLM's default engine (``LLM(...)``, ``vllm serve``) builds the config in the
caller's process, sends it to the engine core process, and the core runs
``VllmConfig.__post_init__`` on it again after its handshake
(``EngineCoreProc._perform_handshakes``): every config hook, the platform's
included, runs a second time, on a config the first pass has changed. An
in-process engine (tests/e2e/harness.py) never runs that pass: the harness and
tests/unit/test_config_passes.py run it here on a copy, as the core would.
"""

import dataclasses
import pickle
import re
from typing import Any

# vLLM stamps each pass with the time (a profile's instance name).
PER_PASS = {".instance_id"}
# Object reprs without a repr of their own name their address.
ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def config_fields(config: Any, path: str = "", depth: int = 0) -> dict[str, str]:
    """Every field of a config and of its nested configs, by dotted path, as
    repr (an object's address left out)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type) or depth > 4:
        return {path: ADDRESS.sub("", repr(config))}
    fields: dict[str, str] = {}
    for field in dataclasses.fields(config):
        try:
            value = getattr(config, field.name, None)
        except Exception as error:
            # transformers refuses a global read of a per-layer attribute
            # (Gemma 4's head_dim): the same refusal on both passes.
            value = f"<{type(error).__name__}>"
        fields |= config_fields(value, f"{path}.{field.name}", depth + 1)
    return fields


def engine_core_pass(vllm_config: Any) -> dict[str, tuple[str, str]]:
    """Runs the engine core's pass on a copy of ``vllm_config`` (sent as the
    core receives it: pickled); the fields it changed, as (before, after). An
    exception the pass raises propagates: the core would die of it."""
    before = config_fields(vllm_config)
    copy = pickle.loads(pickle.dumps(vllm_config))
    copy.__post_init__()
    after = config_fields(copy)
    return {
        name: (before.get(name, "<absent>"), after.get(name, "<absent>"))
        for name in before.keys() | after.keys()
        if name not in PER_PASS and before.get(name) != after.get(name)
    }
