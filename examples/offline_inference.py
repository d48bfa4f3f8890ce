"""The main job: offline batched inference with vLLM's LLM(...) on the HPU plugin.

Chat-formatted prompts go through SmolLM2-135M-Instruct; each prompt is printed
with its generation, then the throughput. Run with ``make run`` (CPU emulation) or
on Gaudi with ``python examples/offline_inference.py --model <dir>``.
"""

import argparse
import time

from vllm import LLM, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a GPU does.",
    "List three fruits that are red.",
    "What is 12 times 7?",
    "Give me a short tip for learning to cook.",
    "Why is the sky blue?",
    "Name a famous painter and one of their works.",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="local model folder")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto: bf16 on Gaudi; in emulation the dtype this CPU runs fast "
        "(bf16 with AVX-512 BF16 or AMX, else float32)",
    )
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="token budget of one step; also sizes the start-up profiling run",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=len(QUESTIONS),
    )
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    started = time.perf_counter()
    outputs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - started
    for question, output in zip(QUESTIONS, outputs, strict=True):
        print(f"Prompt: {question!r}\nGeneration: {output.outputs[0].text!r}\n")
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(
        f"Generated {num_tokens} tokens for {len(outputs)} prompts "
        f"in {elapsed:.2f} s: {num_tokens / elapsed:.1f} output tokens/s, "
        f"{len(outputs) / elapsed:.2f} requests/s"
    )


if __name__ == "__main__":
    main()
