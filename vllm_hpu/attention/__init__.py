"""vLLM's attention backend for the HPU: metadata from our runner, kernels in ops/."""
