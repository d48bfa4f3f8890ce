"""The runner's optional capabilities (LoRA, pooling, multimodal inputs, M-RoPE,
pipeline stages, ...), all constructed in ``factory.py``."""
