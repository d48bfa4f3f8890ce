"""Expert parallelism beyond tensor or data parallelism alone (issue 53): vLLM's
expert load balancing moving experts between ranks while serving, and expert
parallelism with both tensor and data parallelism. Each test reports which
experts every rank holds and the (token, expert) pairs its experts took, from
the engine's own routing, and asserts every rank worked; greedy tokens equal
transformers' (tests/e2e/test_data_parallel.py has the layouts of one kind of
parallelism and their helpers; apart, the CI runs the two modules side by
side)."""

import pytest
import torch
from models import model_path

from e2e.expert_ranks import eplb_rank_load, experts_held
from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy
from e2e.test_data_parallel import EXPERT_PARALLEL, expected_from, offline_data_parallel
from e2e.test_data_parallel import PROMPTS as RANK_PROMPTS

MOE_MODEL = "tiny-mixtral"  # 4 experts, top 2, 2 layers
NUM_EXPERTS, REDUNDANT = 4, 2
PROMPTS = random_prompts([1, 17, 40, 100], 1024, seed=3)
MAX_TOKENS = 16
ENGINE_KWARGS = {"block_size": 16, "max_num_batched_tokens": 64}
# A rearrangement every 8 engine steps (the first after 2: vLLM starts its
# count at 3/4), from the load of the last 4: several while the prompts run.
EPLB_CONFIG = {
    "num_redundant_experts": REDUNDANT,
    "step_interval": 8,
    "window_size": 4,
}


@pytest.mark.timeout(600)
def test_expert_load_balancing_moves_experts_between_ranks():
    """TP=2 with expert parallelism and EPLB, 2 redundant experts (6 physical,
    3 a rank): vLLM's EPLB rearranges the experts from the engine's load
    counts while the prompts are served; afterwards the ranks hold other
    experts, every logical expert still somewhere, and the tokens are
    transformers' (the rearranged weights serve the steps after it)."""
    expected = hf_greedy(model_path(MOE_MODEL), PROMPTS, MAX_TOKENS, torch.float32)
    with vllm_engine(
        model_path(MOE_MODEL),
        distributed_executor_backend="mp",
        tensor_parallel_size=2,
        enable_expert_parallel=True,
        enable_eplb=True,
        eplb_config=EPLB_CONFIG,
        **ENGINE_KWARGS,
    ) as llm:
        before = llm.collective_rpc(experts_held)
        tokens = vllm_greedy(llm, PROMPTS, MAX_TOKENS)
        after = llm.collective_rpc(experts_held)
        loads = llm.collective_rpc(eplb_rank_load)
    print(f"experts per rank and layer: before {before}, after {after}")
    print(f"(token, expert) pairs per rank's experts, last window: {loads}")
    assert tokens == expected
    per_rank = (NUM_EXPERTS + REDUNDANT) // 2
    for held in (before, after):
        assert [len(held[r][layer]) for r in (0, 1) for layer in (0, 1)] == [
            per_rank
        ] * 4
        for layer in (0, 1):
            assert set(held[0][layer]) | set(held[1][layer]) == set(range(NUM_EXPERTS))
    # vLLM's initial placement: the experts in order, then the redundant ones.
    assert before == [{0: [0, 1, 2], 1: [0, 1, 2]}, {0: [3, 0, 1], 1: [3, 0, 1]}]
    assert after != before  # experts moved between the ranks
    assert all(load > 0 for load in loads), loads  # both ranks' experts worked


# Expert parallelism with both tensor and data parallelism (vLLM's sequence-
# parallel experts): each data-parallel rank's pass is split over its two
# tensor-parallel ranks, whose shares meet every other rank's in each MoE
# layer (distributed/communicator.py). TP=2 x DP=2, four emulated cards in
# two rank processes of two workers each (six processes importing vLLM: the
# most a 2-core CI runs in minutes); eager, the offline run above checks
# compilation. Tiny Qwen3-MoE chunks its tokens for the experts (Mixtral does
# not), 8 experts: 2 a rank.
SEQUENCE_PARALLEL_MODEL = "tiny-qwen3-moe"


@pytest.mark.timeout(900)
def test_expert_parallel_with_tensor_and_data_parallel(tmp_path):
    name = SEQUENCE_PARALLEL_MODEL
    single = hf_greedy(model_path(name), RANK_PROMPTS, MAX_TOKENS, torch.float32)
    engine = ENGINE_KWARGS | EXPERT_PARALLEL | {"tensor_parallel_size": 2}
    engine |= {"distributed_executor_backend": "mp", "enforce_eager": True}
    tokens, _, pairs = offline_data_parallel(name, engine, tmp_path, {})
    assert tokens == expected_from(single)
    assert len(pairs) == 4 and all(pairs), pairs  # every rank's experts worked
