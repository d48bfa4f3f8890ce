"""The bucket sets the runner pads to, with a per-step bisecting lookup; a shape
beyond every bucket is rounded up past the range, with a one-time warning."""

import bisect
import itertools

from vllm.logger import init_logger

from vllm_hpu.bucketing.buckets import (
    Bucket,
    DecodeDims,
    PromptDims,
    decode_dims,
    prompt_dims,
)
from vllm_hpu.bucketing.padding import PaddingStats
from vllm_hpu.bucketing.ranges import BucketRange, cover_value, round_beyond
from vllm_hpu.bucketing.settings import BucketingConfig
from vllm_hpu.bucketing.strategies import (
    RANGE_STRATEGIES,
    strategy_decode_buckets,
    strategy_prompt_buckets,
)
from vllm_hpu.envs import get_envs

logger = init_logger("vllm.hpu.bucketing")


class BucketIndex:
    """A bucket set as nested sorted values: batch -> query -> blocks."""

    def __init__(self, buckets: list[Bucket]) -> None:
        self._batch_sizes: list[int] = []
        self._query_lens: dict[int, list[int]] = {}
        self._num_blocks: dict[tuple[int, int], list[int]] = {}
        for bucket in buckets:
            self.add(bucket)

    def add(self, bucket: Bucket) -> None:
        batch_size, query_len, num_blocks = bucket
        if batch_size not in self._query_lens:
            bisect.insort(self._batch_sizes, batch_size)
            self._query_lens[batch_size] = []
        if (batch_size, query_len) not in self._num_blocks:
            bisect.insort(self._query_lens[batch_size], query_len)
            self._num_blocks[batch_size, query_len] = []
        blocks = self._num_blocks[batch_size, query_len]
        index = bisect.bisect_left(blocks, num_blocks)
        if index == len(blocks) or blocks[index] != num_blocks:
            blocks.insert(index, num_blocks)

    def find(self, batch_size: int, query_len: int, num_blocks: int) -> Bucket | None:
        """The first covering bucket in (batch, query, blocks) order, or None."""
        for bs in self._batch_sizes[
            bisect.bisect_left(self._batch_sizes, batch_size) :
        ]:
            query_lens = self._query_lens[bs]
            for query in query_lens[bisect.bisect_left(query_lens, query_len) :]:
                blocks = self._num_blocks[bs, query]
                index = bisect.bisect_left(blocks, num_blocks)
                if index < len(blocks):
                    return Bucket(bs, query, blocks[index])
        return None

    @property
    def buckets(self) -> list[Bucket]:
        return [
            Bucket(bs, query, blocks)
            for bs in self._batch_sizes
            for query in self._query_lens[bs]
            for blocks in self._num_blocks[bs, query]
        ]


def value_lists(buckets: list[Bucket]) -> tuple[list[int], list[int], list[int]]:
    """Each dimension's sorted distinct values (``[0]`` for an empty set)."""
    columns = zip(*buckets, strict=True) if buckets else ([0], [0], [0])
    batch, query, blocks = (sorted(set(column)) for column in columns)
    return batch, query, blocks


def padded_value(needed: int, values: list[int], bucket_range: BucketRange) -> int:
    """A miss's value in one dimension: the covering value, else past the range."""
    if needed <= values[-1]:
        return cover_value(values, needed)
    return max(round_beyond(needed, bucket_range), values[-1])


def verification_batch_rungs(
    decode: list[Bucket], max_groups: int
) -> dict[int, list[int]]:
    """Each decode batch size's block counts, plus a rung halfway between sizes more
    than one apart: three verification groups would pad to four (Q tokens each)."""
    blocks: dict[int, set[int]] = {}
    for bucket in decode:
        blocks.setdefault(bucket.batch_size, set()).add(bucket.num_blocks)
    sizes = sorted(blocks)
    for low, high in itertools.pairwise(sizes):
        middle = (low + high) // 2
        if low < middle <= min(max_groups, max(blocks[high])):
            blocks[middle] = {
                max(middle, -(-count * middle // high)) for count in blocks[high]
            }
    return {size: sorted(counts) for size, counts in blocks.items()}


def verification_buckets(
    decode: list[Bucket], num_queries: int, max_groups: int
) -> list[Bucket]:
    """Per batch size rung its block counts, plus rungs of one and two blocks per
    query group below: each block is read by Q queries, so padding costs Q times."""
    buckets: set[Bucket] = set()
    for size, counts in verification_batch_rungs(decode, max_groups).items():
        buckets.update(Bucket(size, num_queries, count) for count in counts)
        for per_group in (1, 2):
            if size * per_group < counts[0]:
                buckets.add(Bucket(size, num_queries, size * per_group))
    return sorted(buckets)


class HpuBucketManager:
    """Prompt buckets from the config; decode buckets once the KV cache is sized."""

    def __init__(
        self, config: BucketingConfig, exact_shapes: bool | None = None
    ) -> None:
        self.config = config
        # VLLM_HPU_EXACT_SHAPES (unless given): no padding, to measure what it costs.
        self.exact_shapes = (
            get_envs().exact_shapes if exact_shapes is None else exact_shapes
        )
        self.stats = PaddingStats()
        self._prompt_dims = prompt_dims(config)
        self._decode_dims = decode_dims(config)
        self._prompt = BucketIndex([])
        self._decode = BucketIndex([])
        self._verify = BucketIndex([])  # decode buckets of Q query tokens per row
        self._set_prompt_buckets(strategy_prompt_buckets(config))
        self._warned: set[tuple[str, Bucket]] = set()
        # VLLM_FULL_WARMUP, set once warmup ran: a shape it did not run is an error.
        self.strict = False
        # Lookups per phase; a miss ran a shape outside the configured buckets.
        self.hits = {"prompt": 0, "decode": 0}
        self.misses = {"prompt": 0, "decode": 0}
        ranges = [("bs", config.prompt_bs), ("seq", config.prompt_seq)]
        if config.use_context_buckets:
            ranges.append(("block", config.prompt_block))
        self._log_buckets("prompt", ranges, self.prompt_buckets)

    @property
    def prompt_buckets(self) -> list[Bucket]:
        return self._prompt.buckets

    @property
    def decode_buckets(self) -> list[Bucket]:
        """Decode buckets, then their verification twins (speculative decoding)."""
        return self._decode.buckets + self._verify.buckets

    def set_num_kv_blocks(self, num_blocks: int) -> None:
        """(Re)build the decode buckets, clamped to ``num_blocks`` KV blocks."""
        self._set_decode_buckets(strategy_decode_buckets(self.config, num_blocks))
        ranges = [("bs", self.config.decode_bs), ("block", self.config.decode_block)]
        self._log_buckets("decode", ranges, self.decode_buckets)

    def use_buckets(self, prompt: list[Bucket], decode: list[Bucket]) -> None:
        """Replace both bucket sets (a bucket file, a plan, another strategy's)."""
        self._set_prompt_buckets(prompt, from_ranges=False)
        self._set_decode_buckets(decode, from_ranges=False)

    def _set_prompt_buckets(
        self, buckets: list[Bucket], from_ranges: bool | None = None
    ) -> None:
        """A miss rounds within the ranges' values, else within the set's own."""
        self._prompt = BucketIndex(buckets)
        if from_ranges is None:
            from_ranges = self.config.prompt_strategy in RANGE_STRATEGIES
        if not from_ranges:
            self._prompt_dims = PromptDims(*value_lists(buckets))

    def _set_decode_buckets(
        self, buckets: list[Bucket], from_ranges: bool | None = None
    ) -> None:
        """Verification buckets follow the decode ones: (bs, Q, blocks)."""
        buckets = [b for b in buckets if b.query_len == 1]
        self._decode = BucketIndex(buckets)
        queries = self.config.verify_queries
        self._verify = BucketIndex(
            verification_buckets(buckets, queries, self.config.max_num_seqs)
            if queries > 1
            else []
        )
        if from_ranges is None:
            from_ranges = self.config.decode_strategy in RANGE_STRATEGIES
        if not from_ranges:
            batch_sizes, _, num_blocks = value_lists(buckets)
            self._decode_dims = DecodeDims(batch_sizes, num_blocks)

    def find_prompt_bucket(
        self, batch_size: int, query_len: int, num_context_blocks: int
    ) -> Bucket:
        """The smallest prompt bucket covering the batch (a warned miss if none)."""
        bucket, listed = self._cover_prompt(batch_size, query_len, num_context_blocks)
        if self.exact_shapes:
            return bucket
        if listed:
            return self._count_found("prompt", bucket)
        return self._add_miss("prompt", self._prompt, bucket)

    def covering_prompt_bucket(
        self, batch_size: int, query_len: int, num_context_blocks: int
    ) -> Bucket:
        """The bucket a prompt batch of this shape pads to; nothing is counted."""
        return self._cover_prompt(batch_size, query_len, num_context_blocks)[0]

    def has_prompt_bucket(
        self, batch_size: int, query_len: int, num_context_blocks: int
    ) -> bool:
        """Whether a prompt pass of this shape pads to a warmed-up bucket."""
        return self._cover_prompt(batch_size, query_len, num_context_blocks)[1]

    def _cover_prompt(
        self, batch_size: int, query_len: int, num_context_blocks: int
    ) -> tuple[Bucket, bool]:
        """The covering prompt bucket, and whether it is one of the set."""
        if self.exact_shapes:
            return Bucket(batch_size, query_len, num_context_blocks), True
        bucket = self._prompt.find(batch_size, query_len, num_context_blocks)
        if bucket is not None:
            return bucket, True
        dims = self._prompt_dims
        bucket = Bucket(
            padded_value(batch_size, dims.batch_sizes, self.config.prompt_bs),
            padded_value(query_len, dims.query_lens, self.config.prompt_seq),
            padded_value(
                num_context_blocks, dims.context_blocks, self.config.prompt_block
            ),
        )
        return bucket, False

    def find_decode_bucket(
        self, batch_size: int, num_blocks: int, query_len: int = 1
    ) -> Bucket:
        """The smallest decode bucket for ``batch_size`` rows and ``num_blocks`` (a
        warned miss if none); with ``query_len`` > 1, a verification bucket."""
        if self.exact_shapes:
            return Bucket(batch_size, query_len, num_blocks)
        index = self._decode if query_len == 1 else self._verify
        bucket = index.find(batch_size, query_len, num_blocks)
        if bucket is not None and bucket.query_len == query_len:
            return self._count_found("decode", bucket)
        dims = self._decode_dims
        bucket = Bucket(
            padded_value(batch_size, dims.batch_sizes, self.config.decode_bs),
            query_len,
            padded_value(num_blocks, dims.num_blocks, self.config.decode_block),
        )
        return self._add_miss("decode", index, bucket)

    def describe(self, phase: str, bucket: Bucket) -> tuple[int, ...]:
        """As logged: (bs, seq), (bs, seq, ctx), (bs, blocks), (bs, queries, blocks)."""
        if phase == "decode":
            if bucket.query_len > 1:
                return tuple(bucket)
            return (bucket.batch_size, bucket.num_blocks)
        if self.config.use_context_buckets:
            return tuple(bucket)
        return (bucket.batch_size, bucket.query_len)

    def _count_found(self, phase: str, bucket: Bucket) -> Bucket:
        """Count a lookup; a remembered miss is still a shape warmup never ran."""
        if (phase, bucket) in self._warned:
            self.misses[phase] += 1
        else:
            self.hits[phase] += 1
        return bucket

    def _add_miss(self, phase: str, index: BucketIndex, bucket: Bucket) -> Bucket:
        """Remember a shape that was not warmed up, and say so once."""
        self.misses[phase] += 1
        index.add(bucket)
        if (phase, bucket) not in self._warned:
            self._warned.add((phase, bucket))
            shape = ", ".join(str(value) for value in self.describe(phase, bucket))
            if self.strict:
                raise RuntimeError(
                    f"Configuration: ({phase}, {shape}) was not warmed-up! "
                    "(VLLM_FULL_WARMUP forbids it: widen the bucket ranges)"
                )
            logger.warning("Configuration: (%s, %s) was not warmed-up!", phase, shape)
        return bucket

    def mark_warmed(self, strict: bool) -> None:
        """Warmup ran every bucket; with ``strict`` a later miss raises."""
        self.strict = strict

    def _log_buckets(
        self, phase: str, ranges: list[tuple[str, BucketRange]], buckets: list[Bucket]
    ) -> None:
        config = ", ".join(f"{name}:{list(r)}" for name, r in ranges)
        shapes = ", ".join(str(self.describe(phase, b)) for b in buckets)
        strategy = getattr(self.config, f"{phase}_strategy")
        if strategy in RANGE_STRATEGIES:
            logger.info(
                "%s bucket config (min, step, max_warmup) %s",
                phase.capitalize(),
                config,
            )
            if phase == "prompt" and self.config.merged_prefill:
                logger.info(
                    "Merged prefill packs each pass's prompts into one sequence "
                    "of up to seq tokens: the ranges' batch size 1 buckets are "
                    "used, the bs range is not (VLLM_HPU_MERGED_PREFILL=false "
                    "runs one padded row per prompt, with the bs range)."
                )
        else:
            source = self.config.bucket_file if strategy == "file" else "strategy"
            logger.info("%s buckets: %s (%s)", phase.capitalize(), strategy, source)
        logger.info("Generated %d %s buckets: [%s]", len(buckets), phase, shapes)
