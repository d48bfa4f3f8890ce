"""Quantization on the HPU plugin: the fp8_inc KV cache and Intel Neural
Compressor's FP8 flow (``inc``)."""
