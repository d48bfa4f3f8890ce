"""One rank of vLLM's offline data-parallel pattern (its
examples/offline_inference/data_parallel.py): the rank's place in the group comes
from VLLM_DP_* variables, it builds its own LLM and generates its own share of
the prompts. Run by test_data_parallel.py as
``python dp_rank.py MODEL_DIR REQUEST_JSON``; prints the tokens as JSON.

REQUEST_JSON: {"engine": LLM keyword arguments, "prompts": [[token ids]],
"max_tokens": [one per prompt]}. Also prints the graphs torch.compile compiled
in each of the rank's workers during warmup and while generating, and with
enable_return_routed_experts the requests' routed experts and the experts each
worker holds (expert_ranks.py).
"""

import json
import sys


def compiled_graphs(worker: object) -> int:
    """Graphs torch.compile compiled in the worker's process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def main(model_dir: str, request: dict) -> None:
    from expert_ranks import experts_held, greedy_routed
    from vllm import LLM

    llm = LLM(model=model_dir, **request["engine"])
    warmed = llm.collective_rpc(compiled_graphs)  # one per tensor-parallel rank
    tokens, routed = greedy_routed(llm, request["prompts"], request["max_tokens"])
    compiled = llm.collective_rpc(compiled_graphs)
    generating = [
        after - before for before, after in zip(warmed, compiled, strict=True)
    ]
    print("TOKENS " + json.dumps(tokens), flush=True)
    print("COMPILED " + json.dumps([warmed, generating]), flush=True)
    if routed and routed[0] is not None:  # enable_return_routed_experts
        print("ROUTED " + json.dumps([r.tolist() for r in routed]), flush=True)
        print("HELD " + json.dumps(llm.collective_rpc(experts_held)), flush=True)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
