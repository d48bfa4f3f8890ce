"""Hybrid models with the features their refusals used to name, each equal to
transformers token for token (float32):

- speculative decoding, n-gram drafts on Granite-4.0-H (Mamba2) and MTP drafts
  (Qwen3.5's own MTP layer) on Qwen3.5-MoE (gated delta-net) over two
  tensor-parallel workers, which draft alike: a verification
  pass runs each row's tokens as decode steps, keeping the state after each in
  a snapshot, and the next pass resumes from the last accepted token's. The
  method's own proposer drafts first (random tiny models reject nearly every
  draft; the MTP layer's drafts equal a naive MTP layer's, recomputed from
  scratch, at every step), then drafts read from transformers' own tokens with
  one wrong draft in most steps, so rows accept 0 to 3; preemptions and
  chunked prompts on the way (prefix caching is off with drafts on hybrids).
- tensor parallelism (TP=2, two worker processes) with sleep mode on
  Qwen3.5-MoE: the states are sharded with their heads; sleeping at level 1,
  then at level 2 with the weights reloaded, frees the state slots and
  generates the same tokens once awake.
- LoRA on Granite-4.0-H: an adapter on the attention and Mamba2 projections
  equals transformers with it merged, beside requests without it; MoE layers
  take no LoRA here, and an adapter with expert weights is refused as it loads.
"""

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from models import model_path
from vllm import SamplingParams
from vllm.lora.request import LoRARequest

from e2e.harness import (
    SENDS_CALLABLES,
    counted,
    counters,
    default_engine,
    hf_greedy,
    random_prompts,
    vllm_engine,
    vllm_greedy,
)
from e2e.lora_adapters import AdapterSpec, build_adapter, merge_adapter
from e2e.qwen3_5_mtp import NaiveQwen3_5MTP
from e2e.test_eagle import proposed
from e2e.test_generate import vocab_size

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
LENGTHS = [1, 7, 33, 61]
NUM_DRAFTS = 3
# One max_model_len request fits (16 blocks, and 13 for its state groups: a
# block per group and one per draft, which the runner's slots make unused),
# the four prompts with their tokens do not: preemptions.
NUM_BLOCKS = 34
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": NUM_DRAFTS,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
# Qwen3.5's own MTP layer (tiny-qwen3.5-moe-mtp). The MTP layer joins the
# attention group: vLLM pairs the layers in groups of two, and the states take
# two groups (8 blocks a request) where they took three, so fewer blocks keep
# the preemptions.
MTP = {"method": "mtp", "num_speculative_tokens": NUM_DRAFTS}
MTP_NUM_BLOCKS = 26


def prompts(name: str) -> list[list[int]]:
    return random_prompts(LENGTHS, vocab_size(name), seed=5)


@functools.cache
def reference(name: str) -> list[list[int]]:
    return hf_greedy(model_path(name), prompts(name), MAX_TOKENS, torch.float32)


def draft_from(expected: list[list[int]]) -> Any:
    """A worker patch: the runner's proposer drafts each row's next tokens from
    ``expected`` (prompt + transformers' tokens), the ``(step + row) % 4``-th
    of its three drafts made wrong, so rows accept 0, 1, 2 or 3 drafts."""

    def patch(worker: Any) -> None:
        runner = worker.model_runner
        batch = runner.input_batch
        steps = [0]

        def propose(num_drafts: int, sampled: list[list[int]]) -> list[list[int]]:
            steps[0] += 1
            drafts = []
            for row in range(batch.num_reqs):
                n = int(batch.num_tokens_no_spec[row])
                so_far = batch.token_ids_cpu[row, :n].tolist()
                match = next((s for s in expected if s[:n] == so_far), [])
                row_drafts = list(match[n : n + num_drafts])
                wrong = (steps[0] + row) % (NUM_DRAFTS + 1)
                if wrong < len(row_drafts):
                    row_drafts[wrong] = (row_drafts[wrong] + 1) % 1000 + 3
                drafts.append(row_drafts)
            return drafts

        runner.caps.spec.proposer.propose = propose

    return patch


@pytest.mark.parametrize(
    ("name", "speculative_config", "num_blocks", "tensor_parallel_size"),
    [
        ("tiny-granite-4.0-h", NGRAM, NUM_BLOCKS, 1),
        ("tiny-qwen3.5-moe-mtp", MTP, MTP_NUM_BLOCKS, 2),
    ],
    ids=["granite-ngram", "qwen3.5-moe-mtp-tp2"],
)
def test_hybrid_drafts_verified_as_transformers(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    speculative_config: dict,
    num_blocks: int,
    tensor_parallel_size: int,
) -> None:
    expected = reference(name)
    for variable, value in SENDS_CALLABLES.items():  # to TP=2's workers
        monkeypatch.setenv(variable, value)
    parallel = (
        {"distributed_executor_backend": "mp"} if tensor_parallel_size > 1 else {}
    )
    with vllm_engine(
        model_path(name),
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        num_gpu_blocks_override=num_blocks,
        kv_cache_memory_bytes=None,
        speculative_config=speculative_config,
        tensor_parallel_size=tensor_parallel_size,
        **parallel,
    ) as llm:
        assert not llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
        llm.collective_rpc(record_worker_drafts)
        before = counters(llm)
        assert vllm_greedy(llm, prompts(name), MAX_TOKENS) == expected
        assert counted(before, counters(llm), "vllm:spec_decode_num_draft_tokens")
        ranks_proposed = llm.collective_rpc(recorded_drafts)
        full = [p + e for p, e in zip(prompts(name), expected, strict=True)]
        llm.collective_rpc(draft_from(full))
        before = counters(llm)
        assert vllm_greedy(llm, prompts(name), MAX_TOKENS) == expected
        after = counters(llm)
    assert after["vllm:num_preemptions"] > 0
    drafted = counted(before, after, "vllm:spec_decode_num_draft_tokens")
    accepted = counted(before, after, "vllm:spec_decode_num_accepted_tokens")
    assert 0 < accepted < drafted
    if speculative_config is MTP:
        # The MTP layer's own drafts, every step, recomputed naively; both
        # ranks drafted the same (the layer's heads and experts split over
        # them).
        proposed = ranks_proposed[0]
        assert ranks_proposed == [proposed] * tensor_parallel_size
        naive = NaiveQwen3_5MTP(name)
        naive.know(full)
        assert len(proposed) >= 40
        for tokens, drafts in proposed:
            assert drafts == naive.drafts(tokens, len(drafts)), len(tokens)


def record_worker_drafts(worker: Any) -> None:
    """A worker patch: its decoder keeps each proposal's drafts, with the
    tokens they follow, in ``worker.recorded_drafts``."""
    decoder = worker.model_runner.caps.spec
    records: list[tuple[list[int], list[int]]] = []
    propose = decoder.propose

    def recording(scheduler_output: Any, sampled: list[list[int]]) -> None:
        propose(scheduler_output, sampled)
        records.extend(proposed(decoder))

    decoder.propose = recording
    worker.recorded_drafts = records


def recorded_drafts(worker: Any) -> list[tuple[list[int], list[int]]]:
    return worker.recorded_drafts


def test_mtp_drafts_through_the_default_engine() -> None:
    """Qwen3.5's dense MTP layer (vLLM's Qwen3_5MTP) as a user runs it: vLLM's
    default engine, its core in a process of its own; chunked prompts."""
    name = "tiny-qwen3.5-mtp"
    with default_engine(
        model_path(name),
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=48,
        enable_chunked_prefill=True,
        speculative_config=MTP,
    ) as llm:
        llm.collective_rpc(record_worker_drafts)
        assert vllm_greedy(llm, prompts(name), MAX_TOKENS) == reference(name)
        (records,) = llm.collective_rpc(recorded_drafts)
    naive = NaiveQwen3_5MTP(name)
    naive.know([p + e for p, e in zip(prompts(name), reference(name), strict=True)])
    assert len(records) >= 40
    for tokens, drafts in records:
        assert drafts == naive.drafts(tokens, len(drafts)), len(tokens)


def state_slots_bytes(worker: Any) -> int:
    """Device bytes of the worker's state slots."""
    layers = worker.model_runner.caps.state_cache.layers.values()
    return sum(t.untyped_storage().nbytes() for layer in layers for t in layer.kv_cache)


@pytest.mark.timeout(600)
def test_hybrid_tensor_parallel_with_sleep_matches_transformers() -> None:
    name = "tiny-qwen3.5-moe"
    with vllm_engine(
        model_path(name),
        block_size=16,
        max_model_len=256,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        enable_sleep_mode=True,
        # Sharding is what this checks: compiled hybrids are tested in
        # test_hybrid_families.py, and two workers compiling cost a minute.
        enforce_eager=True,
    ) as llm:
        assert vllm_greedy(llm, prompts(name), MAX_TOKENS) == reference(name)
        for level in (1, 2):
            llm.sleep(level=level)
            assert llm.collective_rpc(state_slots_bytes) == [0, 0]
            llm.wake_up(tags=["weights"])
            if level == 2:
                llm.collective_rpc("reload_weights")
            llm.wake_up(tags=["kv_cache"])
            assert vllm_greedy(llm, prompts(name), MAX_TOKENS) == reference(name)


GRANITE = "tiny-granite-4.0-h"
# Attention and Mamba2 projections (the MLP's experts take no LoRA here).
GRANITE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj")


def expert_adapter(adapter: Path, out_dir: Path) -> Path:
    """``adapter`` with LoRA weights for the experts of layer 0 added (vLLM
    names a MoE layer's LoRA module "experts")."""
    import json

    from safetensors.torch import load_file, save_file

    weights = load_file(adapter / "adapter_model.safetensors")
    config = json.loads((adapter / "adapter_config.json").read_text())
    model = json.loads(Path(model_path(GRANITE), "config.json").read_text())
    name = "base_model.model.model.layers.0.block_sparse_moe.experts"
    rank = config["r"]
    weights[f"{name}.lora_A.weight"] = torch.zeros(rank, model["hidden_size"])
    weights[f"{name}.lora_B.weight"] = torch.zeros(model["intermediate_size"], rank)
    out_dir.mkdir()
    save_file(weights, out_dir / "adapter_model.safetensors")
    config["target_modules"] = [*config["target_modules"], "experts"]
    (out_dir / "adapter_config.json").write_text(json.dumps(config))
    return out_dir


def test_hybrid_lora_matches_merged_adapter(tmp_path: Path) -> None:
    adapter = build_adapter(
        model_path(GRANITE), AdapterSpec(8, GRANITE_TARGETS, seed=3), tmp_path / "a"
    )
    merged = merge_adapter(model_path(GRANITE), adapter, tmp_path / "merged")
    with_adapter = hf_greedy(merged, prompts(GRANITE), MAX_TOKENS, torch.float32)
    assert with_adapter != reference(GRANITE)  # the adapter changes the tokens
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    lora = LoRARequest("mamba", 1, str(adapter))
    with vllm_engine(
        model_path(GRANITE),
        block_size=16,
        max_model_len=256,
        enable_lora=True,
        max_lora_rank=8,
    ) as llm:
        outputs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts(GRANITE) * 2],
            params,
            lora_request=[lora] * len(LENGTHS) + [None] * len(LENGTHS),
        )
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        assert tokens == with_adapter + reference(GRANITE)
        experts = expert_adapter(adapter, tmp_path / "experts")
        with pytest.raises(ValueError, match="take no LoRA on the HPU plugin"):
            llm.llm_engine.add_lora(LoRARequest("experts", 2, str(experts)))
