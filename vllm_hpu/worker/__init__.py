"""Worker and model runner: vLLM's scheduler output in, padded forward passes out."""
