"""vLLM's logprob rank count run eagerly, on Gaudi and in emulation.

Why: vLLM compiles ``batched_count_greater_than`` with the platform's
``simple_compile_backend`` (hpu_backend on Gaudi), and its sampler marks the
batch dimension of the inputs unbacked first (``mark_unbacked``, sampler.py);
Habana's graph compiler refuses symbolic sizes ("TypeError: Cannot convert
symbols to int", vllm-gaudi 091bbad ``vllm_gaudi/patches.py:25-31``), so every
request with logprobs failed in eager/compile mode.
In emulation the same compile ran on the first request with logprobs, after
warmup (benchmarks/soak.py counted it: one graph compiled while serving).
How: both module-level names (the sampler imported its own) point at the
function as vLLM wrote it, without torch.compile: one comparison and a sum.
Upstream change that removes it: vLLM skipping ``mark_unbacked`` (or the
compile) on platforms whose backend takes no unbacked sizes.
"""

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
