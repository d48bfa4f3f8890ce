"""LoRA on a mixture-of-experts model's other layers: its MoE layers stay
vLLM's own, without LoRA."""

import functools


# MoE layers without LoRA.
# Why: with --enable-lora vLLM wraps every MoE layer of the model in its MoE
# LoRA layer, which runs vLLM's modular expert kernels and asserts that the
# layer's MoE method is not monolithic; the plugin's (ops/fused_moe.py) is,
# so any MoE model (Mixtral, Qwen3-MoE, Qwen3-Next, Granite-4.0-H, ...) failed
# to start with LoRA on.
# How: vLLM's two MoE LoRA layer classes leave its table of LoRA layers, so
# MoE layers stay unwrapped while attention, MLP and state-layer projections
# take adapters; an adapter with expert weights is refused when it loads.
# Upstream change that removes it: a MoE LoRA path for monolithic methods.
@functools.cache
def keep_moe_layers_without_lora() -> None:
    from vllm.lora import utils
    from vllm.lora.layers.fused_moe import FusedMoE3DWithLoRA, FusedMoEWithLoRA

    moe = (FusedMoEWithLoRA, FusedMoE3DWithLoRA)
    utils._all_lora_classes = tuple(
        cls for cls in utils._all_lora_classes if cls not in moe
    )
