"""vLLM's logprob rank count run eagerly, on Gaudi and in emulation.

Why: vLLM compiles ``batched_count_greater_than`` with hpu_backend after
``mark_unbacked`` on the batch dimension; Habana's compiler refuses symbolic
sizes ("Cannot convert symbols to int", vllm-gaudi 091bbad patches.py:25-31).
In emulation the compile ran on the first request with logprobs, after warmup.
How: both module-level names point at the uncompiled function.
Upstream change that removes it: vLLM skipping ``mark_unbacked`` (or the
compile) where the backend takes no unbacked sizes."""

import functools


@functools.cache
def count_ranks_eagerly() -> None:
    """Idempotent."""
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs

    compiled = logprobs.batched_count_greater_than
    eager = getattr(compiled, "_torchdynamo_orig_callable", compiled)
    logprobs.batched_count_greater_than = eager
    sampler.batched_count_greater_than = eager  # type: ignore[attr-defined]
