"""Quantization on the HPU plugin: every quantization method with its kernels (fp8,
int8, 4-bit AWQ/GPTQ/WNA16, MXFP4, their MoE methods), checkpoint checks, the
fp8_inc KV cache and Intel Neural Compressor's FP8 flow (``inc``)."""
