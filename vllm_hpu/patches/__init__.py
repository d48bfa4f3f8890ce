"""Every change the plugin makes to code it does not own, one module per patch.
Each module says why it exists, how it works and which upstream change removes it.

- ``accelerator``: ``torch.accelerator`` memory and sync calls of vLLM's loader
  and shutdown, no-ops where torch has no accelerator (CPU emulation); EPLB's
  events and current stream answered on the host.
- ``engine_args``: ``--device hpu`` / ``device="hpu"`` accepted and checked; the
  options a user set (async scheduling, dtype, state-cache options) recorded
  before vLLM resolves them; the KV transfer config checked once vLLM derives it.
- ``torchvision_import``: PyPI's CUDA-built torchvision imports beside the CPU
  torch (also as the set-up's interpreter-start hook).
- ``fp8_kernels``: the block-fp8 linear kernel in vLLM's kernel table; per-tensor
  scales of fused fp8 layers kept per shard.
- ``nixl``: ``import nixl`` answered by the nixl-cu12 wheel.
- ``log_records``: log lines that read as failures and are not, dropped.
- ``eplb_config``: ``--enable-eplb`` past vLLM's CUDA-only check, completed as vLLM
  completes it (weight exchange over gloo, synchronous rearrangement).
"""
