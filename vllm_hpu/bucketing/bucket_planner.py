"""Trace-driven bucket planning (``--trace ... --plan-out``): within a graph
budget, from one bucket per phase covering every shape, greedily add the traced
shape that lowers padding most; a final replay covers any pass left without."""

import math
from collections import Counter

from vllm_hpu.bucketing.bucket_file import BucketSets
from vllm_hpu.bucketing.buckets import Bucket
from vllm_hpu.bucketing.manager import BucketIndex, HpuBucketManager
from vllm_hpu.bucketing.replay import ReplayResult, replay_step, replay_trace
from vllm_hpu.bucketing.settings import BucketingConfig
from vllm_hpu.bucketing.trace import StepTrace

Shapes = Counter[Bucket]


def traced_shapes(trace: StepTrace, config: BucketingConfig) -> tuple[Shapes, Shapes]:
    """The (unpadded) prompt passes and decode batches the trace's steps make,
    prompt chunks grouped as the runner groups them when shapes are exact."""
    recorder = _ShapeRecorder(config)
    result = ReplayResult()
    for step in trace.steps:
        if step.prompts or step.decode_blocks:
            replay_step(step, recorder, result)
    return recorder.prompt, recorder.decode


class _ShapeRecorder(HpuBucketManager):
    """An exact-shapes manager that counts every shape it is asked about."""

    def __init__(self, config: BucketingConfig) -> None:
        super().__init__(config, exact_shapes=True)
        self.prompt: Shapes = Counter()
        self.decode: Shapes = Counter()

    def find_prompt_bucket(
        self, batch_size: int, query_len: int, num_context_blocks: int
    ) -> Bucket:
        bucket = super().find_prompt_bucket(batch_size, query_len, num_context_blocks)
        self.prompt[bucket] += 1
        return bucket

    def find_decode_bucket(
        self, batch_size: int, num_blocks: int, query_len: int = 1
    ) -> Bucket:
        bucket = super().find_decode_bucket(batch_size, num_blocks, query_len)
        self.decode[bucket] += 1
        return bucket


def padding_cost(shapes: Shapes, buckets: list[Bucket], phase: str) -> float:
    """Padded / real of each quantity, summed; infinite if a shape has no bucket."""
    index = BucketIndex(buckets)
    real = [0, 0]
    padded = [0, 0]
    for shape, count in shapes.items():
        bucket = index.find(*shape)
        if bucket is None:
            return math.inf
        if phase == "prompt":
            quantities = [
                (
                    shape.batch_size * shape.query_len,
                    bucket.batch_size * bucket.query_len,
                )
            ]
        else:
            quantities = [
                (shape.batch_size, bucket.batch_size),
                (shape.num_blocks, bucket.num_blocks),
            ]
        for i, (need, got) in enumerate(quantities):
            real[i] += need * count
            padded[i] += (got - need) * count
    return sum(p / r for p, r in zip(padded, real, strict=True) if r)


def candidates(shapes: Shapes, phase: str, block_size: int) -> set[Bucket]:
    """Buckets worth trying: the traced shapes, prompt queries rounded to a block."""
    if phase == "decode":
        return set(shapes)
    return {
        s._replace(query_len=math.ceil(s.query_len / block_size) * block_size)
        for s in shapes
    }


def covering(shapes: Shapes, phase: str, block_size: int) -> Bucket:
    """One bucket covering every shape: each dimension's maximum."""
    most = [max(values) for values in zip(*shapes, strict=True)]
    if phase == "prompt":
        most[1] = math.ceil(most[1] / block_size) * block_size
    return Bucket(*most)


def _best_addition(
    chosen: dict[str, list[Bucket]],
    costs: dict[str, float],
    traced: dict[str, Shapes],
    pool: dict[str, set[Bucket]],
) -> tuple[str, Bucket, float] | None:
    """The phase and bucket whose addition lowers the padding most, if any."""
    best: tuple[str, Bucket, float] | None = None
    for phase, options in pool.items():
        for bucket in options - set(chosen[phase]):
            cost = padding_cost(traced[phase], [*chosen[phase], bucket], phase)
            gain = costs[phase] - cost
            if gain > 1e-12 and (best is None or gain > costs[best[0]] - best[2]):
                best = (phase, bucket, cost)
    return best


def plan_buckets(trace: StepTrace, config: BucketingConfig, budget: int) -> BucketSets:
    """At most ``budget`` buckets (more only if the trace needs them covered)."""
    prompt, decode = traced_shapes(trace, config)
    traced = {"prompt": prompt, "decode": decode}
    block_size = config.block_size
    chosen = {
        phase: [covering(shapes, phase, block_size)] if shapes else []
        for phase, shapes in traced.items()
    }
    costs = {
        phase: padding_cost(traced[phase], chosen[phase], phase) for phase in traced
    }
    pool = {phase: candidates(traced[phase], phase, block_size) for phase in traced}
    while sum(len(b) for b in chosen.values()) < budget:
        best = _best_addition(chosen, costs, traced, pool)
        if best is None:
            break
        phase, bucket, cost = best
        chosen[phase].append(bucket)
        costs[phase] = cost
    return cover_replayed_misses(
        trace, config, BucketSets(sorted(chosen["prompt"]), sorted(chosen["decode"]))
    )


def cover_replayed_misses(
    trace: StepTrace, config: BucketingConfig, sets: BucketSets
) -> BucketSets:
    """Replay ``sets`` as the runner would; add the bucket of every missed pass."""
    manager = HpuBucketManager(config, exact_shapes=False)
    manager.use_buckets(list(sets.prompt), list(sets.decode))
    manager.strict = False
    replay_trace(trace, manager)
    return BucketSets(manager.prompt_buckets, manager.decode_buckets)
