"""Routed experts returned with the output (``enable_return_routed_experts``,
issue 53): for every token of a request but its last, the expert ids the
engine's router chose in each layer come back with the output, and they are
the experts transformers' router chooses on the same tokens (teacher-forced
on prompt and output). Tiny GLM-4-MoE has DeepSeek-V3's routing (sigmoid
scores with a correction bias, expert groups, a scaling factor) after a dense
first layer; the prompts run in chunks of a 64-token budget beside decodes, so
a step is several padded passes whose rows go back in request order."""

from models import model_path

from e2e.expert_ranks import assert_same_experts, transformers_routing
from e2e.harness import engine_spec, random_prompts, uses_engines

MODEL = "tiny-glm4-moe"
ROUTED = engine_spec(
    MODEL,
    block_size=16,
    max_num_batched_tokens=64,
    enable_return_routed_experts=True,
)
PROMPTS = random_prompts([1, 17, 40, 100], 1024, seed=3)
MAX_TOKENS = 8


@uses_engines(ROUTED)
def test_routed_experts_are_transformers_router_choices(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False
    )
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        completion = output.outputs[0]
        tokens = [*prompt, *completion.token_ids]
        routed = completion.routed_experts
        # One row per token the model ran: all but the last sampled one.
        assert routed is not None and routed.shape == (len(tokens) - 1, 2, 2)
        expected = transformers_routing(model_path(MODEL), tokens[:-1])
        assert list(expected) == [1]  # layer 0 is dense
        assert_same_experts(routed, expected)
        assert not routed[:, 0].any()  # a dense layer routes nothing
