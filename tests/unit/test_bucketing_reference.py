"""Strategies ``reference`` and ``reference-merged`` against the reference Gaudi
plugin's own bucket lists (tests/data/reference_buckets.json: its generator at
vllm-gaudi 091bbadd, run outside this repository, for ten configurations)."""

import json
from pathlib import Path

import pytest

from vllm_hpu.bucketing import Bucket, BucketingConfig, HpuBucketManager, ServingLimits
from vllm_hpu.bucketing.reference import reference_range
from vllm_hpu.envs import read_envs

REFERENCE = json.loads(
    (Path(__file__).parents[1] / "data" / "reference_buckets.json").read_text()
)
CASES = REFERENCE["cases"]


def strategy_env(merged: bool) -> dict[str, str]:
    return {
        "VLLM_HPU_BUCKETING_STRATEGY": "reference-merged" if merged else "reference"
    }


def reference_manager(case: dict, environ: dict[str, str]) -> HpuBucketManager:
    limits = ServingLimits(
        **case["limits"],
        use_context_buckets=True,
        prefix_caching=case["prefix_caching"],
    )
    config = BucketingConfig.from_limits(limits, read_envs(environ))
    manager = HpuBucketManager(config, exact_shapes=False)
    manager.set_num_kv_blocks(case["num_kv_blocks"])
    return manager


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=[
        f"{c['name']}-{'merged' if c['merged_prefill'] else 'default'}" for c in CASES
    ],
)
def test_reference_strategies_give_the_references_own_buckets(case):
    manager = reference_manager(case, strategy_env(case["merged_prefill"]))
    assert manager.prompt_buckets == [Bucket(*b) for b in case["prompt"]]
    assert manager.decode_buckets == [Bucket(*b) for b in case["decode"]]
    # Prompt passes run as the reference's mode does: packed or one per prompt.
    assert manager.config.merged_prefill == case["merged_prefill"]


def test_the_example_configuration_counts_as_the_issue_states():
    """106 graphs by default, about 71 in its merged-prefill mode; its 2048-token
    query ladder is ceil(log2(2048)) = 11 points: 768, 1280 and 1664 included."""
    example = [c for c in CASES if c["name"] == "example"]
    counts = [len(c["prompt"]) + len(c["decode"]) for c in example]
    assert counts == [106, 71]
    queries = {q for _, q, _ in example[0]["prompt"]}
    assert {768, 1280, 1664} <= queries and not {640, 1152, 1536} & queries


def test_reference_range_reproduces_its_docstring_example():
    assert reference_range(128, 128, 2048, 10) == [
        *(128, 256, 384, 512, 640, 896, 1152, 1536, 2048)
    ]


@pytest.mark.parametrize(
    ("strategy", "merged"), [("reference", "true"), ("reference-merged", "false")]
)
def test_a_reference_strategy_refuses_the_other_prompt_mode(strategy, merged):
    environ = {
        "VLLM_HPU_BUCKETING_STRATEGY": strategy,
        "VLLM_HPU_MERGED_PREFILL": merged,
    }
    with pytest.raises(ValueError, match="VLLM_HPU_MERGED_PREFILL"):
        reference_manager(CASES[0], environ)


def test_an_empty_reference_set_stops_start_up():
    """The reference refuses a configuration its filters leave without prompt
    buckets (a budget of one block, merged, a 32-token max_model_len)."""
    case = {
        "limits": dict(
            max_num_seqs=1, max_num_batched_tokens=512, max_model_len=32, block_size=16
        ),
        "prefix_caching": True,
        "num_kv_blocks": 100,
    }
    with pytest.raises(ValueError, match="reference's prompt buckets are empty"):
        reference_manager(case, strategy_env(merged=True))
