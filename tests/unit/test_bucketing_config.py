"""BucketingConfig: documented defaults, user values, legacy names, clear errors."""

from types import SimpleNamespace

import pytest

from vllm_hpu.bucketing.ranges import BucketRange
from vllm_hpu.bucketing.settings import BucketingConfig, ServingLimits
from vllm_hpu.envs import read_envs

LIMITS = ServingLimits(
    max_num_seqs=128, max_num_batched_tokens=8192, max_model_len=4096, block_size=128
)


def config_for(environ, limits=LIMITS):
    return BucketingConfig.from_limits(limits, read_envs(environ))


@pytest.mark.parametrize(
    ("limits", "field", "expected"),
    [
        (LIMITS, "prompt_bs", (1, 32, 64)),
        (LIMITS, "prompt_seq", (128, 128, 4096)),
        (LIMITS, "decode_bs", (1, 32, 128)),
        (LIMITS, "decode_block", (1, 16, 4096)),
        (LIMITS, "prompt_block", (0, 1, 0)),
        (ServingLimits(8, 2048, 1024, 16), "prompt_bs", (1, 8, 8)),
        (ServingLimits(8, 2048, 1024, 16), "decode_block", (1, 128, 512)),
        (ServingLimits(2, 2048, 1024, 128), "decode_block", (1, 16, 128)),
        (ServingLimits(8, 2048, 4096, 128, True), "prompt_block", (0, 8, 32)),
        (ServingLimits(8, 2048, 4096, 16, True), "prompt_block", (0, 64, 256)),
    ],
)
def test_documented_defaults(limits, field, expected):
    assert getattr(config_for({}, limits), field) == BucketRange(*expected)


def test_user_values_override_defaults():
    config = config_for(
        {
            "VLLM_PROMPT_BS_BUCKET_MAX": "4",
            "VLLM_DECODE_BLOCK_BUCKET_STEP": "64",
            "VLLM_EXPONENTIAL_BUCKETING": "true",
        }
    )
    assert config.prompt_bs == BucketRange(1, 32, 4)
    assert config.decode_block == BucketRange(1, 64, 4096)
    assert config.exponential


@pytest.mark.parametrize(
    ("environ", "blocks", "converted"),
    [
        (
            {
                "VLLM_DECODE_SEQ_BUCKET_MIN": "128",
                "VLLM_DECODE_SEQ_BUCKET_STEP": "128",
                "VLLM_DECODE_SEQ_BUCKET_MAX": "2048",
            },
            (1, 1, 16),
            True,
        ),
        (
            {"VLLM_DECODE_SEQ_BUCKET_MAX": "2000", "VLLM_DECODE_BLOCK_BUCKET_MIN": "4"},
            (4, 16, 16),
            True,
        ),
        (
            {
                "VLLM_DECODE_SEQ_BUCKET_MAX": "2048",
                "VLLM_DECODE_BLOCK_BUCKET_MAX": "512",
            },
            (1, 16, 512),
            False,
        ),
    ],
)
def test_legacy_decode_seq_is_tokens_converted_to_blocks(
    environ, blocks, converted, vllm_log
):
    config = config_for(environ)
    assert config.decode_block == BucketRange(*blocks)
    logged = " ".join(vllm_log.messages())
    assert ("VLLM_DECODE_SEQ_BUCKET_MAX is in tokens" in logged) == converted


@pytest.mark.parametrize(
    ("environ", "limits", "message"),
    [
        (
            {
                "VLLM_PROMPT_SEQ_BUCKET_MIN": "2048",
                "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024",
            },
            LIMITS,
            "VLLM_PROMPT_SEQ_BUCKET_MIN=2048 is greater than "
            "VLLM_PROMPT_SEQ_BUCKET_MAX=1024",
        ),
        (
            {"VLLM_PROMPT_BS_BUCKET_MIN": "128"},
            LIMITS,
            "VLLM_PROMPT_BS_BUCKET_MIN=128 is greater than "
            "VLLM_PROMPT_BS_BUCKET_MAX (default 64)",
        ),
        (
            {"VLLM_PROMPT_BLOCK_BUCKET_STEP": "0"},
            LIMITS,
            "VLLM_PROMPT_BLOCK_BUCKET_STEP=0 is invalid: the step must be >= 1",
        ),
        (
            {"VLLM_DECODE_BLOCK_BUCKET_STEP": "0"},
            LIMITS,
            "VLLM_DECODE_BLOCK_BUCKET_STEP=0 is invalid: the step must be >= 1",
        ),
        (
            {"VLLM_DECODE_BLOCK_BUCKET_MIN": "0"},
            LIMITS,
            "VLLM_DECODE_BLOCK_BUCKET_MIN=0 is invalid: it must be >= 1",
        ),
        (
            {
                "VLLM_DECODE_SEQ_BUCKET_MIN": "2048",
                "VLLM_DECODE_SEQ_BUCKET_MAX": "1024",
            },
            LIMITS,
            "VLLM_DECODE_SEQ_BUCKET_MIN=2048 (16 blocks) is greater than "
            "VLLM_DECODE_SEQ_BUCKET_MAX=1024 (8 blocks)",
        ),
    ],
)
def test_meaningless_ranges_raise_naming_the_variables(environ, limits, message):
    with pytest.raises(ValueError, match="unset them") as error:
        config_for(environ, limits)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "name", ["VLLM_PROMPT_BS_BUCKET_STEP", "VLLM_DECODE_BS_BUCKET_MIN"]
)
def test_zero_for_batch_or_seq_variables_rejected_when_read(name):
    with pytest.raises(ValueError, match=f"{name}='0' is not valid"):
        read_envs({name: "0"})


@pytest.mark.parametrize(
    ("prefix_caching", "chunked_prefill", "speculative", "use_context"),
    [
        (False, False, False, False),
        (True, False, False, True),
        (False, True, False, True),
        (True, True, False, True),
        (False, False, True, False),  # drafts are verified as decode rows
    ],
)
@pytest.mark.parametrize("runner_type", ["generate", "pooling"])
@pytest.mark.parametrize("is_hybrid", [False, True])
def test_from_vllm_config_reads_limits(
    prefix_caching, chunked_prefill, speculative, use_context, runner_type, is_hybrid
):
    vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_seqs=16,
            max_num_batched_tokens=2048,
            enable_chunked_prefill=chunked_prefill,
        ),
        cache_config=SimpleNamespace(
            block_size=128, enable_prefix_caching=prefix_caching
        ),
        model_config=SimpleNamespace(
            max_model_len=1024, runner_type=runner_type, is_hybrid=is_hybrid
        ),
        speculative_config=(
            SimpleNamespace(method="ngram", num_speculative_tokens=3)
            if speculative
            else None
        ),
    )
    config = BucketingConfig.from_vllm_config(vllm_config, read_envs({}))
    # Pooling prompts keep one row each (they may be bidirectional), and so do
    # hybrids' (each row scans from its own state).
    assert config.merged_prefill == (runner_type == "generate" and not is_hybrid)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (16, 2048)
    assert (config.max_model_len, config.block_size) == (1024, 128)
    assert config.use_context_buckets == use_context
    assert (config.prompt_block.max > 0) == use_context
    assert config.verify_queries == (4 if speculative else 1)
