"""Run the same prompts through vLLM on the plugin and through transformers.

vLLM runs in this process (no engine subprocess) so tests stay fast; every engine
is shut down and the distributed state cleaned before the next one starts.
"""

import contextlib
import gc
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

KV_CACHE_BYTES = 64 << 20  # small, so tests never size a cache from host RAM


def random_prompts(
    lengths: list[int], vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """Token-id prompts of the given lengths, avoiding the special tokens."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


@torch.no_grad()
def hf_greedy(
    model_dir: str,
    prompts: list[list[int]],
    max_tokens: int,
    dtype: torch.dtype,
    attn_implementation: str | None = None,
    prepare: Callable[[torch.nn.Module], None] | None = None,
) -> list[list[int]]:
    """Greedy continuations by transformers, one sequence at a time (no padding).
    ``attn_implementation="eager"`` where torch's SDPA cannot express the model's
    attention (Gemma 2's soft-capping); ``prepare`` changes the loaded model
    (e.g. hooks that quantize activations as a quantized checkpoint's do)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation=attn_implementation
    ).eval()
    if prepare is not None:
        prepare(model)
    outputs = []
    for prompt in prompts:
        input_ids = torch.tensor([prompt])
        generated: list[int] = []
        past = None
        for _ in range(max_tokens):
            result = model(input_ids=input_ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(result.logits[0, -1].argmax())
            generated.append(token)
            input_ids = torch.tensor([[token]])
        outputs.append(generated)
    return outputs


@contextlib.contextmanager
def vllm_engine(model_dir: str, **kwargs: Any) -> Iterator[Any]:
    """An LLM on the plugin in emulation, torn down on exit."""
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("kv_cache_memory_bytes", KV_CACHE_BYTES)
    kwargs.setdefault("max_model_len", 1024)
    kwargs.setdefault("seed", 0)
    kwargs.setdefault("disable_log_stats", False)
    llm = LLM(model=model_dir, **kwargs)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


def vllm_greedy(llm: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [list(r.outputs[0].token_ids) for r in results]
