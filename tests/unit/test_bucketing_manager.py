"""HpuBucketManager: documented bucket sets and logs, lookup, filters, misses."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.envs import read_envs

# These tests are about the range (linear/exponential) strategies.
# One row per prompt: these tests pin the unpacked prompt buckets.
LINEAR = {"VLLM_HPU_BUCKETING_STRATEGY": "linear", "VLLM_HPU_MERGED_PREFILL": "false"}

# The documented run: prompt bs:[1, 32, 4] seq:[128, 128, 1024], block size 128.
DOC_PROMPT = {"VLLM_PROMPT_BS_BUCKET_MAX": "4", "VLLM_PROMPT_SEQ_BUCKET_MAX": "1024"}
DOC_DECODE_BS = {"VLLM_DECODE_BS_BUCKET_STEP": "128", "VLLM_DECODE_BS_BUCKET_MAX": "4"}


def make_manager(environ, limits, num_kv_blocks=None):
    manager = HpuBucketManager(
        BucketingConfig.from_limits(limits, read_envs({**LINEAR, **environ}))
    )
    if num_kv_blocks is not None:
        manager.set_num_kv_blocks(num_kv_blocks)
    return manager


def doc_manager(num_kv_blocks=4096):
    return make_manager(DOC_PROMPT, ServingLimits(128, 4096, 1024, 128), num_kv_blocks)


def test_documented_prompt_buckets_and_log(vllm_log):
    manager = doc_manager(num_kv_blocks=None)
    expected = [Bucket(bs, q, 0) for bs in (1, 2, 4) for q in range(128, 1025, 128)]
    assert manager.prompt_buckets == expected
    config_line = "Prompt bucket config (min, step, max_warmup) "
    assert config_line + "bs:[1, 32, 4], seq:[128, 128, 1024]" in vllm_log.messages()
    shapes = ", ".join(str((b.batch_size, b.query_len)) for b in expected)
    assert f"Generated 24 prompt buckets: [{shapes}]" in vllm_log.messages()


@pytest.mark.parametrize(
    ("environ", "max_model_len", "config_line", "count", "last"),
    [
        # Block counts given directly: 128..2048 blocks fit 1 sequence of 256k tokens.
        (
            {
                "VLLM_DECODE_BLOCK_BUCKET_MIN": "128",
                "VLLM_DECODE_BLOCK_BUCKET_STEP": "128",
                "VLLM_DECODE_BLOCK_BUCKET_MAX": "2048",
            },
            262144,
            "bs:[1, 128, 4], block:[128, 128, 2048]",
            48,
            (4, 2048),
        ),
        # The documented seq:[128, 128, 2048] in tokens (older releases): 1..16
        # blocks. 3 of the 48 go: 2 sequences never hold 1 block, 3 or 4 never 2.
        (
            {
                "VLLM_DECODE_SEQ_BUCKET_MIN": "128",
                "VLLM_DECODE_SEQ_BUCKET_STEP": "128",
                "VLLM_DECODE_SEQ_BUCKET_MAX": "2048",
            },
            2048,
            "bs:[1, 128, 4], block:[1, 1, 16]",
            45,
            (4, 16),
        ),
    ],
)
def test_documented_decode_buckets(
    environ, max_model_len, config_line, count, last, vllm_log
):
    limits = ServingLimits(128, 4096, max_model_len, 128)
    manager = make_manager(environ | DOC_DECODE_BS, limits, num_kv_blocks=8192)
    assert len(manager.decode_buckets) == count
    messages = vllm_log.messages()
    assert f"Decode bucket config (min, step, max_warmup) {config_line}" in messages
    generated = f"Generated {count} decode buckets: "
    listed = [m for m in messages if m.startswith(generated)]
    assert listed and listed[0].endswith(f"{last}]")


def test_three_prompts_of_412_tokens_then_decode_shrinks():
    manager = doc_manager()
    assert manager.find_prompt_bucket(3, 412, 0) == Bucket(4, 512, 0)
    blocks_per_seq = math.ceil(413 / 128)
    assert manager.find_decode_bucket(3, 3 * blocks_per_seq).batch_size == 4
    assert manager.find_decode_bucket(2, 2 * blocks_per_seq).batch_size == 2


@pytest.mark.parametrize(
    ("request_shape", "expected"),
    [
        ((1, 1, 0), (1, 128, 0)),
        ((1, 128, 0), (1, 128, 0)),
        ((1, 129, 0), (1, 256, 0)),
        ((2, 1000, 0), (2, 1024, 0)),
        ((4, 1024, 0), (4, 1024, 0)),
    ],
)
def test_prompt_lookup_smallest_cover(request_shape, expected):
    assert doc_manager().find_prompt_bucket(*request_shape) == Bucket(*expected)


def test_decode_blocks_clamped_to_kv_capacity_and_max_model_len():
    manager = make_manager({}, ServingLimits(8, 2048, 1024, 16), num_kv_blocks=100)
    by_batch = {}
    for bucket in manager.decode_buckets:
        by_batch.setdefault(bucket.batch_size, []).append(bucket.num_blocks)
    # Defaults at block size 16: 1, 2, 4, ..., 64, then every 128 blocks.
    assert by_batch[1] == [1, 2, 4, 8, 16, 32, 64]  # 1024 tokens: 64 blocks
    assert by_batch[2] == [2, 4, 8, 16, 32, 64, 100]  # capped by 100 KV blocks
    assert max(by_batch[8]) == 100
    manager.set_num_kv_blocks(50)
    assert max(b.num_blocks for b in manager.decode_buckets) == 50


@pytest.mark.parametrize(
    ("phase", "request_shape", "expected", "warning"),
    [
        ("prompt", (1, 36864, 0), (1, 36864, 0), "(prompt, 1, 36864)"),
        ("prompt", (5, 100, 0), (32, 128, 0), "(prompt, 32, 128)"),
        ("prompt", (3, 1025, 0), (4, 1152, 0), "(prompt, 4, 1152)"),
        ("decode", (5, 10), (128, 1, 16), "(decode, 128, 16)"),
        ("decode", (1, 5000), (1, 1, 5008), "(decode, 1, 5008)"),
    ],
)
def test_miss_returns_rounded_bucket_and_warns_once(
    phase, request_shape, expected, warning, vllm_log
):
    manager = make_manager(
        DOC_PROMPT | DOC_DECODE_BS, ServingLimits(128, 4096, 1024, 128)
    )
    manager.set_num_kv_blocks(8192)
    find = (
        manager.find_prompt_bucket if phase == "prompt" else manager.find_decode_bucket
    )
    vllm_log.take()
    first, second = find(*request_shape), find(*request_shape)
    assert first == second == Bucket(*expected)
    assert vllm_log.messages() == [f"Configuration: {warning} was not warmed-up!"]
    buckets = manager.prompt_buckets if phase == "prompt" else manager.decode_buckets
    assert Bucket(*expected) in buckets


def test_miss_shows_context_when_context_buckets_are_in_use(vllm_log):
    manager = make_manager({}, ServingLimits(4, 4096, 1024, 128, True))
    vllm_log.take()
    bucket = manager.find_prompt_bucket(1, 2000, 9)
    assert bucket == Bucket(1, 2048, 16)
    assert vllm_log.messages() == [
        "Configuration: (prompt, 1, 2048, 16) was not warmed-up!"
    ]


limits_strategy = st.builds(
    ServingLimits,
    max_num_seqs=st.integers(1, 64),
    max_num_batched_tokens=st.integers(64, 8192),
    max_model_len=st.integers(64, 4096),
    block_size=st.sampled_from([16, 64, 128]),
    use_context_buckets=st.booleans(),
)
PROPERTY_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def property_manager(limits, exponential, num_kv_blocks):
    environ = {"VLLM_EXPONENTIAL_BUCKETING": "1" if exponential else "0"}
    return make_manager(environ, limits, num_kv_blocks)


@st.composite
def prompt_cases(draw):
    limits = draw(limits_strategy)
    manager = property_manager(limits, draw(st.booleans()), None)
    config = manager.config
    batch_size = draw(st.integers(1, min(config.prompt_bs.max, limits.max_num_seqs)))
    most_query = min(config.prompt_seq.max, limits.max_num_batched_tokens // batch_size)
    query_len = draw(st.integers(1, max(1, most_query)))
    context = 0
    if limits.use_context_buckets:
        context = draw(st.integers(0, max(0, limits.max_model_len - query_len)))
    legal = batch_size * query_len <= limits.max_num_batched_tokens
    legal = legal and query_len + context <= limits.max_model_len
    num_blocks = math.ceil(context / limits.block_size)
    return manager, (batch_size, query_len, num_blocks), legal


@PROPERTY_SETTINGS
@given(prompt_cases())
def test_every_legal_prompt_maps_to_a_warmed_covering_bucket(case):
    manager, shape, legal = case
    warmed = set(manager.prompt_buckets)
    bucket = manager.find_prompt_bucket(*shape)
    assert all(b >= s for b, s in zip(bucket, shape, strict=True))
    if legal:
        assert bucket in warmed
    assert manager.find_prompt_bucket(*shape) == bucket  # deterministic


@st.composite
def decode_cases(draw):
    limits = draw(limits_strategy)
    num_kv_blocks = draw(st.integers(1, 5000))
    manager = property_manager(limits, draw(st.booleans()), num_kv_blocks)
    config = manager.config
    per_seq = math.ceil(limits.max_model_len / limits.block_size)
    most_seqs = min(config.decode_bs.max, limits.max_num_seqs, num_kv_blocks)
    num_seqs = draw(st.integers(1, most_seqs))
    most_blocks = min(num_seqs * per_seq, num_kv_blocks, config.decode_block.max)
    num_blocks = draw(st.integers(num_seqs, max(num_seqs, most_blocks)))
    return manager, (num_seqs, num_blocks), num_blocks <= most_blocks


@PROPERTY_SETTINGS
@given(decode_cases())
def test_every_legal_decode_maps_to_a_warmed_covering_bucket(case):
    manager, (num_seqs, num_blocks), legal = case
    warmed = set(manager.decode_buckets)
    bucket = manager.find_decode_bucket(num_seqs, num_blocks)
    assert bucket.batch_size >= num_seqs and bucket.num_blocks >= num_blocks
    assert bucket.query_len == 1
    if legal:
        assert bucket in warmed
    assert manager.find_decode_bucket(num_seqs, num_blocks) == bucket


def lower_corners(values):
    return dict(zip(values, [0, *values[:-1]], strict=True))


@PROPERTY_SETTINGS
@given(limits_strategy, st.booleans(), st.integers(1, 5000))
def test_every_generated_bucket_is_needed_by_some_legal_request(
    limits, exponential, num_kv_blocks
):
    """Filters: each bucket is the smallest cover of its smallest padded request,
    and that request respects every limit."""
    manager = property_manager(limits, exponential, num_kv_blocks)
    block_size = limits.block_size
    prompt_sizes = sorted({b.batch_size for b in manager.prompt_buckets})
    query_lens = sorted({b.query_len for b in manager.prompt_buckets})
    contexts = sorted({b.num_blocks for b in manager.prompt_buckets})
    for bucket in manager.prompt_buckets:
        batch_size = lower_corners(prompt_sizes)[bucket.batch_size] + 1
        query_len = lower_corners(query_lens)[bucket.query_len] + 1
        blocks = (
            lower_corners(contexts)[bucket.num_blocks] + 1 if bucket.num_blocks else 0
        )
        context = max(0, (blocks - 1) * block_size + 1) if blocks else 0
        assert batch_size <= limits.max_num_seqs
        assert batch_size * query_len <= limits.max_num_batched_tokens
        assert query_len + context <= limits.max_model_len
        assert manager.find_prompt_bucket(batch_size, query_len, blocks) == bucket
    per_seq = math.ceil(limits.max_model_len / block_size)
    for bucket in manager.decode_buckets:
        assert bucket.num_blocks <= min(num_kv_blocks, bucket.batch_size * per_seq)
        assert bucket.num_blocks >= 1


@pytest.mark.parametrize("strategy", ["compact", "linear", "exponential"])
def test_decode_buckets_fit_a_kv_cache_smaller_than_max_num_seqs(strategy):
    """The issue's case: 256 sequences of 4096 tokens, a cache of 100 blocks. No
    bucket holds more blocks than the cache, and every batch size is one that a
    batch of at most 100 sequences (each owns a block) pads to."""
    environ = {"VLLM_HPU_BUCKETING_STRATEGY": strategy}
    limits = ServingLimits(256, 2048, 4096, 16)
    buckets = make_manager(environ, limits, num_kv_blocks=100).decode_buckets
    batch_sizes = sorted({b.batch_size for b in buckets})
    assert max(b.num_blocks for b in buckets) <= 100
    assert batch_sizes[-1] >= 100 and batch_sizes[-2] < 100
