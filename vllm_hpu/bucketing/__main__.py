"""``python -m vllm_hpu.bucketing``: the buckets a configuration would warm up.

The VLLM_*_BUCKET_* variables apply as in the server; nothing is loaded or run.
"""

import argparse
import logging
import math
from collections.abc import Sequence

from vllm_hpu import envs
from vllm_hpu.bucketing.config import BucketingConfig, ServingLimits
from vllm_hpu.bucketing.manager import HpuBucketManager

# vLLM's scheduler defaults and the plugin's block size, so a bare call is typical.
DEFAULT_MAX_NUM_SEQS = 128
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_BLOCK_SIZE = 128


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_hpu.bucketing", description=__doc__
    )
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS
    )
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument(
        "--num-kv-blocks",
        type=int,
        default=None,
        help="KV cache capacity in blocks (default: enough for every sequence)",
    )
    parser.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefix caching on, as in vLLM (adds context buckets)",
    )
    parser.add_argument(
        "--chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="chunked prefill on, as in vLLM (adds context buckets)",
    )
    parser.add_argument(
        "--exponential",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exponential spacing (default: VLLM_EXPONENTIAL_BUCKETING)",
    )
    return parser.parse_args(argv)


def build_manager(args: argparse.Namespace) -> HpuBucketManager:
    hpu_envs = envs.get_envs()
    if args.exponential is not None:
        hpu_envs = envs.HpuEnvs(
            **{**vars(hpu_envs), "exponential_bucketing": args.exponential}
        )
    limits = ServingLimits(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        use_context_buckets=args.prefix_caching or args.chunked_prefill,
    )
    manager = HpuBucketManager(BucketingConfig.from_limits(limits, hpu_envs))
    num_kv_blocks = args.num_kv_blocks
    if num_kv_blocks is None:
        num_kv_blocks = args.max_num_seqs * math.ceil(
            args.max_model_len / args.block_size
        )
    manager.set_num_kv_blocks(num_kv_blocks)
    return manager


def report(manager: HpuBucketManager) -> str:
    """Bucket counts and the warmup they cost (the buckets themselves are logged)."""
    spacing = "exponential" if manager.config.exponential else "linear"
    num_prompt, num_decode = len(manager.prompt_buckets), len(manager.decode_buckets)
    total = num_prompt + num_decode
    return (
        f"{total} buckets ({spacing}): {num_prompt} prompt + {num_decode} decode\n"
        f"warmup: {total} forward steps, then up to {total} graph captures "
        "as the graph memory budget allows"
    )


def main(argv: Sequence[str] | None = None) -> None:
    # The manager logs each phase's config and bucket list, as the server does.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(report(build_manager(parse_args(argv))))


if __name__ == "__main__":
    main()
