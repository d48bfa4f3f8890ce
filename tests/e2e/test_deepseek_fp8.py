"""DeepSeek-V3's block-FP8 layout end to end (issue 53): a tiny DeepSeek-V2-MoE
with every decoder linear (the latent attention's projections, the dense and
shared MLPs, the routed experts) in 128 x 128 block FP8, as DeepSeek-R1 ships,
generates the greedy tokens transformers generates from the dequantized
weights, with the activations quantized where and as the plugin quantizes
them: per token and group of 128 (dynamic fp8) at the input of every linear
but kv_b_proj, whose latent input stays as it is (decode and cached context
use its dequantized W_UK / W_UV in latent space, so prompt tokens do too),
and the routed experts, which take their input as it is (the reference's
path for block-fp8 experts). Prompts of mixed lengths in chunks of a 64-token
budget: prompt passes with cached context, beside decodes."""

from pathlib import Path

import torch
from models import model_path
from quant_checkpoints import LINEAR_NAMES, Fp8Scheme, fp8_groups, write_checkpoints

from e2e.harness import hf_greedy, random_prompts, vllm_engine, vllm_greedy

MODEL = "tiny-deepseek-v2-moe-128"
BLOCK = 128
LENGTHS = [3, 17, 40, 100]
MAX_TOKENS = 8
# The linears whose input the plugin leaves as it is.
UNQUANTIZED_INPUTS = ("kv_b_proj",)


def quantize_as_the_plugin(model: torch.nn.Module) -> None:
    """transformers' linears get their input rounded through fp8 per token and
    group of 128 where the plugin's do (its fused routed experts are no
    Linear modules: their input stays as it is, as the plugin's)."""
    quantize = fp8_groups(BLOCK)

    def round_input(_module, args):  # type: ignore[no-untyped-def]
        return (quantize(args[0], None), *args[1:])

    for name, module in model.named_modules():
        last = name.split(".")[-1]
        if last in LINEAR_NAMES and last not in UNQUANTIZED_INPUTS:
            module.register_forward_pre_hook(round_input)


def test_every_linear_in_block_fp8_generates_what_transformers_does(tmp_path):
    quant_dir, deq_dir = write_checkpoints(
        Path(model_path(MODEL)), tmp_path, Fp8Scheme()
    )
    prompts = random_prompts(LENGTHS, 1024, seed=1)
    expected = hf_greedy(
        str(deq_dir), prompts, MAX_TOKENS, torch.float32,
        prepare=quantize_as_the_plugin,
    )  # fmt: skip
    with vllm_engine(
        str(quant_dir),
        enforce_eager=True,
        block_size=16,
        max_num_batched_tokens=64,
    ) as llm:
        methods = llm.apply_model(linear_methods)[0]
        actual = vllm_greedy(llm, prompts, MAX_TOKENS)
    # Every decoder linear and the experts run quantized (fp8 in memory); only
    # the routers stay unquantized, as the checkpoint has them.
    unquantized = {n for n, m in methods.items() if m.startswith("Unquantized")}
    assert unquantized <= {"1.mlp.gate"} and len(methods) > 10, methods
    assert actual == expected


def linear_methods(model: torch.nn.Module) -> dict[str, str]:
    """The quantization method of each decoder linear and MoE layer."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.linear import LinearBase

    return {
        name: type(module.quant_method).__name__
        for name, module in model.model.layers.named_modules()
        if isinstance(module, (LinearBase, RoutedExperts))
    }
