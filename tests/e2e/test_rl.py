"""RL frameworks' use of the engine (issue 36): sleep mode and weight updates.

A trainer (this process) holding a transformers copy of tiny-llama changes its
weights with a few optimizer steps, pushes them through the "hpu" weight
transfer backend to a sleeping LLM (with TP=2 its workers are two other
processes, each loading its shard), wakes it,
and the LLM's greedy generations equal transformers' with the new weights.
Sleep at levels 1 and 2 hands the weights' and the KV cache's bytes back to the
emulated device meter, and generations after waking equal those before.
"""

import copy
from typing import Any

import pytest
import torch
from models import model_path

from e2e.harness import compiled_graphs, random_prompts, vllm_engine, vllm_greedy

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"  # 4 query heads, 2 KV heads, vocab 1024: TP=2 shards evenly
VOCAB_SIZE = 1024
MAX_TOKENS = 6
PROMPTS = random_prompts([5, 11, 3], VOCAB_SIZE, seed=3)


@torch.no_grad()
def _greedy(model: torch.nn.Module, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuations, without a cache (few tokens)."""
    outputs = []
    for prompt in prompts:
        tokens = list(prompt)
        for _ in range(MAX_TOKENS):
            logits = model(input_ids=torch.tensor([tokens])).logits
            tokens.append(int(logits[0, -1].argmax()))
        outputs.append(tokens[len(prompt) :])
    return outputs


def _train(model: torch.nn.Module, steps: int, seed: int) -> None:
    """A few optimizer steps of next-token loss on random tokens."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    for _ in range(steps):
        batch = torch.randint(3, VOCAB_SIZE, (4, 16), generator=generator)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _sender(tp: int, transport: str) -> Any:
    """Trainer-side init info: chunks in host shared memory, or a gloo group of
    the trainer and the ``tp`` workers. Small chunks: every round spans several
    update_weights calls."""
    from vllm.utils.network_utils import get_open_port

    from vllm_hpu.distributed.weight_transfer import HpuTrainerInitInfo

    if transport == "shm":
        return HpuTrainerInitInfo(rank=0, chunk_bytes=1 << 20)
    return HpuTrainerInitInfo(
        rank=0,
        chunk_bytes=1 << 20,
        master_address="127.0.0.1",
        master_port=get_open_port(),
        world_size=1 + tp,
    )


@pytest.mark.parametrize(
    ("tp", "transport"), [(1, "shm"), (2, "gloo")], ids=["tp1-shm", "tp2-gloo"]
)
def test_rl_loop(tp: int, transport: str) -> None:
    """Two rounds of train, sleep, wake the weights, push, wake the KV cache,
    generate: the first round sleeps at level 2 (the weights are dropped, so
    only the pushed ones can be there), the second at level 1."""
    from transformers import AutoModelForCausalLM
    from vllm.distributed.weight_transfer import (
        ModuleSource,
        WeightTransferTrainerFactory,
    )

    from vllm_hpu.distributed.weight_transfer import LLMClient

    trainer = AutoModelForCausalLM.from_pretrained(
        model_path(MODEL), dtype=torch.float32
    )
    original = copy.deepcopy(trainer).eval()
    with vllm_engine(
        model_path(MODEL),
        enable_sleep_mode=True,
        weight_transfer_config={"backend": "hpu"},
        tensor_parallel_size=tp,  # TP=2: the workers are processes of their own
    ) as llm:
        assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == _greedy(original, PROMPTS)
        engine = WeightTransferTrainerFactory.trainer_init(
            _sender(tp, transport),
            client=LLMClient(llm),
            source=ModuleSource(trainer),
        )
        for round_, level in enumerate((2, 1)):
            _train(trainer, steps=3, seed=round_)
            expected = _greedy(trainer, PROMPTS)
            llm.sleep(level=level)
            llm.wake_up(tags=["weights"])
            engine.send_weights()
            llm.wake_up(tags=["kv_cache"])
            assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == expected, level
        # The pushed weights changed the generations (else the check is void).
        assert expected != _greedy(original, PROMPTS)
        engine.shutdown()


def _meter(worker: Any) -> dict[str, int]:
    """The worker's device meter, and what its weights and KV cache hold."""
    from vllm_hpu import device
    from vllm_hpu.emulation import device_memory as emulated_memory

    runner = worker.model_runner
    params = runner.model.parameters()
    caches = {
        id(t.untyped_storage()): t for kv in runner.kv_caches.values() for t in kv
    }
    return {
        "used": device.memory_used(),
        "on_host": emulated_memory.meter().on_host,
        "weights": sum(p.numel() * p.element_size() for p in params),
        "kv_cache": sum(t.untyped_storage().nbytes() for t in caches.values()),
    }


def test_sleep_levels_free_device_memory() -> None:
    """Level 1 keeps the weights on the host, level 2 drops them (reloaded from
    the checkpoint on wake); both free at least 90 % of the weights' and the KV
    cache's device bytes, and generate as before once awake."""
    # A KV cache about the weights' size: each alone is over 10 % of the sum.
    with vllm_engine(
        model_path(MODEL), enable_sleep_mode=True, kv_cache_memory_bytes=8 << 20
    ) as llm:
        before = vllm_greedy(llm, PROMPTS, MAX_TOKENS)
        for level in (1, 2):
            awake = llm.collective_rpc(_meter)[0]
            llm.sleep(level=level)
            asleep = llm.collective_rpc(_meter)[0]
            freed = awake["used"] - asleep["used"]
            assert freed >= 0.9 * (awake["weights"] + awake["kv_cache"]), level
            assert asleep["weights"] == 0 and asleep["kv_cache"] == 0
            kept = asleep["on_host"] - awake["on_host"]
            if level == 1:  # the weights wait on the host
                assert kept >= awake["weights"]
            else:  # only buffers (rotary tables) wait there
                assert kept < awake["weights"] / 10
            llm.wake_up(tags=["weights"])
            if level == 2:
                llm.collective_rpc("reload_weights")
            llm.wake_up(tags=["kv_cache"])
            assert llm.collective_rpc(_meter)[0]["on_host"] == awake["on_host"]
            assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == before, level


def test_compiled_graphs_survive_sleep(hpu_env) -> None:
    """Compiled mode: the graphs warmup compiled serve again after both sleep
    levels without a new compilation (dynamo guards on the tensors' shapes,
    strides and dtypes, which waking keeps), and generate as before."""
    hpu_env(
        VLLM_HPU_COMPILE_BACKEND="eager",
        VLLM_PROMPT_SEQ_BUCKET_MIN="16",
        VLLM_PROMPT_SEQ_BUCKET_STEP="16",
        VLLM_PROMPT_SEQ_BUCKET_MAX="16",
        VLLM_PROMPT_BLOCK_BUCKET_MAX="2",
    )
    engine = dict(block_size=16, max_model_len=64, max_num_seqs=4)
    with vllm_engine(
        model_path(MODEL), enable_sleep_mode=True, enforce_eager=False, **engine
    ) as llm:
        before = vllm_greedy(llm, PROMPTS, MAX_TOKENS)
        compiled = compiled_graphs()
        assert compiled > 0  # warmup compiled the buckets
        for level in (1, 2):
            llm.sleep(level=level)
            llm.wake_up(tags=["weights"])
            if level == 2:
                llm.collective_rpc("reload_weights")
            llm.wake_up(tags=["kv_cache"])
            assert vllm_greedy(llm, PROMPTS, MAX_TOKENS) == before, level
        assert compiled_graphs() == compiled
