"""Bucket ranges from vLLM's limits and VLLM_*_BUCKET_*; bad combinations raise.
Prompt context (prefix caching / chunked prefill): 0, 1, 2, 4, ... blocks,
then every 1024 tokens, up to ceil((max_model_len - 1) / block_size) blocks.
Decode blocks: 1, 2, 4, ... blocks, then every 2048 tokens' worth."""

import dataclasses
import math
from typing import TYPE_CHECKING

from vllm.logger import init_logger

from vllm_hpu.bucketing.ranges import BucketRange
from vllm_hpu.envs import HpuEnvs

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("vllm.hpu.bucketing")

# Past-context buckets step by about this many tokens once the ramp is done:
# context only costs attention, so coarse steps pad cheaply.
CONTEXT_STEP_TOKENS = 1024
# Decode block buckets step by this many tokens' worth of blocks: the reference's
# block_size blocks (16k tokens) padded a mixed workload's decode blocks 38 %, ours 6 %.
DECODE_STEP_TOKENS = 2048
# The decode block maximum is never below this, as documented.
MIN_DECODE_BLOCK_MAX = 128
# The context dimension when neither prefix caching nor chunked prefill is on.
NO_CONTEXT = BucketRange(0, 1, 0)
PARTS = ("min", "step", "max")
# Strategies whose sets have no (min, step, max) ranges: a user's ranges win.
SETS_WITHOUT_RANGES = ("compact", "reference", "reference-merged")
# Strategies that reproduce a way of running prompt passes: merged or not.
REFERENCE_MERGED_PREFILL = {"reference": False, "reference-merged": True}
# The range variables of each phase (decode_seq: older releases' token form).
DIMS = {"prompt": ("bs", "seq", "block"), "decode": ("bs", "block", "seq")}


@dataclasses.dataclass(frozen=True)
class ServingLimits:
    """The vLLM limits bucketing depends on, as plain numbers."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    # Prefix caching or chunked prefill: prompt passes may follow cached blocks.
    use_context_buckets: bool = False
    # Only the reference strategy looks at it (its decode blocks count differently).
    prefix_caching: bool = True
    # Speculative decoding: a verification pass's queries per row (k + 1).
    verify_queries: int = 1


@dataclasses.dataclass(frozen=True)
class BucketingConfig:
    """Everything bucket generation needs; ranges are ``(min, step, max)``."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    use_context_buckets: bool
    exponential: bool
    # How each phase's buckets are made (docs/bucketing.md, "Strategies"), or file.
    prompt_strategy: str
    decode_strategy: str
    bucket_file: str
    prompt_bs: BucketRange
    prompt_seq: BucketRange
    # In KV blocks of already-computed context; NO_CONTEXT when not in use.
    prompt_block: BucketRange
    decode_bs: BucketRange
    # In KV blocks: the padded total block count P of a flat decode batch.
    decode_block: BucketRange
    # Prompt passes pack their chunks: prompt buckets are (1, tokens, context).
    merged_prefill: bool = False
    prefix_caching: bool = True
    # Verification queries per row (last token + k drafts); decode buckets get a twin.
    verify_queries: int = 1

    @classmethod
    def from_vllm_config(
        cls, vllm_config: "VllmConfig", envs: HpuEnvs
    ) -> "BucketingConfig":
        """Read the limits from vLLM's config, then the variables from ``envs``."""
        scheduler = vllm_config.scheduler_config
        cache = vllm_config.cache_config
        limits = ServingLimits(
            max_num_seqs=scheduler.max_num_seqs,
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            max_model_len=vllm_config.model_config.max_model_len,
            block_size=cache.block_size,
            use_context_buckets=bool(
                cache.enable_prefix_caching or scheduler.enable_chunked_prefill
            ),
            prefix_caching=bool(cache.enable_prefix_caching),
            verify_queries=_verify_queries(vllm_config),
        )
        config = cls.from_limits(limits, envs)
        model_config = vllm_config.model_config
        if config.merged_prefill and model_config.runner_type == "pooling":
            # Pooling prompts may be bidirectional and are pooled per row.
            logger.info("Pooling model: prompt passes keep one row per prompt.")
            config = dataclasses.replace(config, merged_prefill=False)
        if config.merged_prefill and model_config.is_hybrid:
            # State layers scan each row from its own state (ops/mamba.py).
            logger.info("Hybrid model: prompt passes keep one row per prompt.")
            config = dataclasses.replace(config, merged_prefill=False)
        return config

    @classmethod
    def from_limits(cls, limits: ServingLimits, envs: HpuEnvs) -> "BucketingConfig":
        """Resolve every dimension: the user's value where set, else the default."""
        defaults = default_ranges(limits)
        ranges = {
            name: resolve_range(
                envs, name, default, _legacy_decode_blocks(envs, limits, name)
            )
            for name, default in defaults.items()
        }
        if not limits.use_context_buckets:
            ranges["prompt_block"] = NO_CONTEXT
        strategy = base_strategy(envs)
        prompt_strategy = phase_strategy(envs, "prompt", strategy)
        return cls(
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_model_len=limits.max_model_len,
            block_size=limits.block_size,
            use_context_buckets=limits.use_context_buckets,
            exponential=strategy == "exponential",
            prompt_strategy=prompt_strategy,
            decode_strategy=phase_strategy(envs, "decode", strategy),
            bucket_file=envs.bucketing_from_file,
            merged_prefill=resolve_merged_prefill(envs, prompt_strategy),
            prefix_caching=limits.prefix_caching,
            verify_queries=limits.verify_queries,
            **ranges,
        )


def _verify_queries(vllm_config: "VllmConfig") -> int:
    """Query tokens per row of a verification pass: k drafts + 1 (1: none)."""
    spec = vllm_config.speculative_config
    return 1 + (spec.num_speculative_tokens or 0) if spec is not None else 1


def base_strategy(envs: HpuEnvs) -> str:
    """A bucket file, else VLLM_EXPONENTIAL_BUCKETING when set, else the strategy."""
    if envs.bucketing_from_file:
        return "file"
    if envs.exponential_bucketing is not None:
        return "exponential" if envs.exponential_bucketing else "linear"
    return envs.bucketing_strategy


def user_range_variables(envs: HpuEnvs, phase: str) -> list[str]:
    """The phase's VLLM_{PHASE}_*_BUCKET_* variables the user set."""
    return [
        env_name(f"{phase}_{dim}", part)
        for dim in DIMS[phase]
        for part in PARTS
        if getattr(envs, f"{phase}_{dim}_bucket_{part}") is not None
    ]


def phase_strategy(envs: HpuEnvs, phase: str, strategy: str) -> str:
    """Range variables set for a phase make its buckets linear: the user's
    ranges win over the sets that have no ranges (compact, reference)."""
    if strategy not in SETS_WITHOUT_RANGES:
        return strategy
    user_set = user_range_variables(envs, phase)
    if not user_set:
        return strategy
    logger.info(
        "%s set: %s buckets use the linear ranges instead of the %s set.",
        ", ".join(user_set),
        phase,
        strategy,
    )
    return "linear"


def resolve_merged_prefill(envs: HpuEnvs, prompt_strategy: str) -> bool:
    """VLLM_HPU_MERGED_PREFILL, else by what the prompt buckets were made for: a
    reference strategy its own mode; a user's batch-size range unpacked; else packed."""
    chosen = envs.merged_prefill
    fixed = REFERENCE_MERGED_PREFILL.get(prompt_strategy)
    if fixed is not None:
        if chosen is not None and chosen != fixed:
            other = "reference" if fixed else "reference-merged"
            raise ValueError(
                f"VLLM_HPU_BUCKETING_STRATEGY={prompt_strategy} reproduces the "
                f"reference's {'merged-prefill mode' if fixed else 'default'}, "
                f"which VLLM_HPU_MERGED_PREFILL={str(chosen).lower()} contradicts: "
                f"unset VLLM_HPU_MERGED_PREFILL, or use {other}."
            )
        return fixed
    if chosen is not None:
        return chosen
    batch_sizes = [v for v in user_range_variables(envs, "prompt") if "_BS_" in v]
    if batch_sizes:
        logger.info(
            "%s set: prompt passes run one padded row per prompt with these batch "
            "sizes, instead of merged prefill (VLLM_HPU_MERGED_PREFILL=true packs "
            "them into one row, using only the ranges' batch size 1 buckets).",
            ", ".join(batch_sizes),
        )
        return False
    return True


def default_ranges(limits: ServingLimits) -> dict[str, BucketRange]:
    """The documented defaults, keyed like the fields of :class:`BucketingConfig`."""
    seqs, block_size, max_len = (
        limits.max_num_seqs,
        limits.block_size,
        limits.max_model_len,
    )
    context_step = max(1, CONTEXT_STEP_TOKENS // block_size)
    decode_step = max(1, DECODE_STEP_TOKENS // block_size)
    # The most cached blocks a request can have while still computing one token.
    max_context_blocks = math.ceil((max_len - 1) / block_size)
    max_decode_blocks = max(
        MIN_DECODE_BLOCK_MAX, math.ceil(seqs * max_len / block_size)
    )
    defaults = {
        "prompt_bs": BucketRange(1, min(seqs, 32), min(seqs, 64)),
        "prompt_seq": BucketRange(block_size, block_size, max_len),
        "prompt_block": BucketRange(0, context_step, max_context_blocks),
        "decode_bs": BucketRange(1, min(seqs, 32), seqs),
        "decode_block": BucketRange(1, decode_step, max_decode_blocks),
    }
    # Tiny limits (max_model_len below a block) must not make the defaults invalid.
    return {name: r._replace(min=min(r.min, r.max)) for name, r in defaults.items()}


def env_name(name: str, part: str) -> str:
    """``prompt_bs``, ``min`` -> ``VLLM_PROMPT_BS_BUCKET_MIN``."""
    return f"VLLM_{name.upper()}_BUCKET_{part.upper()}"


def resolve_range(
    envs: HpuEnvs,
    name: str,
    default: BucketRange,
    legacy: dict[str, tuple[str, int]],
) -> BucketRange:
    """One dimension: each part from its variable, a ``legacy`` alias (variable,
    value), or the default; errors name whichever variable the user set."""
    values: list[int] = []
    sources: list[str] = []
    for part, fallback in zip(PARTS, default, strict=True):
        user = getattr(envs, f"{name}_bucket_{part}")
        if user is not None:
            values.append(user)
            sources.append(f"{env_name(name, part)}={user}")
        elif part in legacy:
            values.append(legacy[part][1])
            sources.append(f"{legacy[part][0]} ({legacy[part][1]} blocks)")
        else:
            values.append(fallback)
            sources.append(f"{env_name(name, part)} (default {fallback})")
    bucket_range = BucketRange(*values)
    validate_range(name, bucket_range, sources)
    return bucket_range


def validate_range(name: str, bucket_range: BucketRange, sources: list[str]) -> None:
    """Raise a ``ValueError`` naming the variables when the range means nothing."""
    low, step, high = bucket_range
    smallest = 0 if name == "prompt_block" else 1
    fix = (
        f"set the variables, or unset them to get the defaults ({env_name(name, '*')})"
    )
    if low < smallest:
        raise ValueError(f"{sources[0]} is invalid: it must be >= {smallest}; {fix}.")
    if step <= 0:
        raise ValueError(f"{sources[1]} is invalid: the step must be >= 1; {fix}.")
    if low > high:
        raise ValueError(
            f"{sources[0]} is greater than {sources[2]}: the minimum must not exceed "
            f"the maximum; {fix}."
        )


def _legacy_decode_blocks(
    envs: HpuEnvs, limits: ServingLimits, name: str
) -> dict[str, tuple[str, int]]:
    """Older releases' ``VLLM_DECODE_SEQ_BUCKET_*`` (tokens) as block counts."""
    if name != "decode_block":
        return {}
    legacy = {}
    for part in PARTS:
        tokens = getattr(envs, f"decode_seq_bucket_{part}")
        if tokens is not None and getattr(envs, f"decode_block_bucket_{part}") is None:
            blocks = math.ceil(tokens / limits.block_size)
            legacy[part] = (f"{env_name('decode_seq', part)}={tokens}", blocks)
            logger.info(
                "%s is in tokens (older Gaudi releases); decode buckets count KV "
                "blocks, so it is read as %s=%d (ceil(%d / block_size %d)).",
                env_name("decode_seq", part),
                env_name("decode_block", part),
                blocks,
                tokens,
                limits.block_size,
            )
    return legacy
