"""Every change the plugin makes to code it does not own, one module per patch.
Each module says why it exists, how it works and which upstream change removes it.

- ``accelerator``: ``torch.accelerator`` memory and sync calls of vLLM's loader
  and shutdown, no-ops where torch has no accelerator (CPU emulation); EPLB's
  events and current stream answered on the host.
- ``engine_args``: ``--device hpu`` / ``device="hpu"`` accepted and checked; the
  options a user set (async scheduling, dtype, state-cache options, the hybrid
  KV cache manager) recorded on the config before vLLM resolves them, for every
  pass of the platform's hook (the engine core runs it again); the KV transfer
  config checked, and the KV cache manager chosen, once vLLM derives the connector.
- ``engine_failures``: a dead engine's cause quoted in the caller's exception;
  utility calls still waiting on a dead engine core fail instead of waiting.
- ``engine_shutdown``: an engine core stopped with --shutdown-timeout 0 (``vllm
  serve``'s default) gets vLLM's usual 5 s to exit before it is killed.
- ``torchvision_import``: PyPI's CUDA-built torchvision imports beside the CPU
  torch (also as the set-up's interpreter-start hook).
- ``fp8_kernels``: the block-fp8 linear kernel in vLLM's kernel table; per-tensor
  scales of fused fp8 layers kept per shard.
- ``nixl``: ``import nixl`` answered by the nixl-cu12 wheel.
- ``triton_import``: no triton in a CPU emulation process (its nanobind extension
  reported leaks at every engine process's exit); ``interpreter_start`` is what
  the set-up's ``.pth`` file runs.
- ``log_records``: log lines that read as failures and are not, dropped.
- ``eplb_config``: ``--enable-eplb`` past vLLM's CUDA-only check, completed as vLLM
  completes it (weight exchange over gloo, synchronous rearrangement).
"""
