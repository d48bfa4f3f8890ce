"""What an attention layer runs with, settled once at start-up from vLLM's config
and the plugin's variables: its binding window, whether the fused prompt kernel
takes it, and how long passes are cut (the ops take these as plain numbers)."""

from vllm.config import get_current_vllm_config_or_none
from vllm.logger import init_logger

from vllm_hpu import device
from vllm_hpu.envs import get_envs
from vllm_hpu.ops.prompt_attention import fused_unsupported_reason
from vllm_hpu.ops.sliced_attention import NO_SLICING, PromptSlicing

logger = init_logger("vllm.hpu.attention")


def binding_window(sliding_window: int | None) -> int | None:
    """The layer's window, or None where it never binds (full attention)."""
    config = get_current_vllm_config_or_none()
    if sliding_window is None or config is None or config.model_config is None:
        return sliding_window
    max_model_len = config.model_config.max_model_len
    return sliding_window if sliding_window < max_model_len else None


def use_fused(
    head_size: int, logits_soft_cap: float | None, alibi_slopes: list[float] | None
) -> bool:
    """Whether this layer may run the fused prompt kernel (else logged at start)."""
    reason = fused_unsupported_reason(
        head_size, logits_soft_cap, alibi_slopes is not None
    )
    if reason and device.fused_sdpa() is not None:
        logger.info_once(
            "Prompt attention of layers with %s runs the plain path: the fused "
            "kernel does not take it.",
            reason,
        )
    return not reason


def prompt_slicing() -> PromptSlicing:
    """How prompt passes are cut into tiles (VLLM_HPU_FSDPA_SLICE_*)."""
    envs = get_envs()
    if not envs.fsdpa_slice_enabled:
        return NO_SLICING
    return PromptSlicing(envs.fsdpa_slice_seq_len_thld, envs.fsdpa_slice_chunk_size)


def decode_block_slice() -> int:
    """KV blocks a decode layer reads at a time (VLLM_HPU_DECODE_BLOCK_SLICE)."""
    return get_envs().decode_block_slice
