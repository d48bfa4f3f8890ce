"""The compute core in plain PyTorch with static shapes: KV cache, attention, ops."""
