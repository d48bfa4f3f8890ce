"""Talk to `vllm serve` on the HPU plugin with the official `openai` package.

Start a server first (CPU emulation shown; on Gaudi leave out the variable):

    VLLM_HPU_EMULATION=1 vllm serve .cache/models/smollm2-135m-instruct \\
        --served-model-name smollm2 --max-model-len 2048

then run ``python examples/openai_client.py --model smollm2``. It sends a
completion, a chat and a streamed chat, and prints each answer.
"""

import argparse

from openai import OpenAI


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="the server's model name")
    parser.add_argument("--max-tokens", type=int, default=32)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # vLLM checks no key unless it was started with --api-key; the client needs one.
    client = OpenAI(base_url=args.base_url, api_key="EMPTY")

    completion = client.completions.create(
        model=args.model,
        prompt="The capital of France is",
        max_tokens=args.max_tokens,
        temperature=0.0,
    )
    print("completion:", completion.choices[0].text)

    question = "Write a haiku about the sea."
    chat = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": question}],
        max_tokens=args.max_tokens,
        temperature=0.0,
    )
    print("chat:", chat.choices[0].message.content)

    print("streamed chat: ", end="", flush=True)
    stream = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": question}],
        max_tokens=args.max_tokens,
        temperature=0.0,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
