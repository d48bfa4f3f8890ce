"""Qwen3.5 with images (Qwen3_5ForConditionalGeneration and its MoE: Qwen3-VL's
tower without deepstack before the hybrid decoder of gated delta-net and gated
attention layers, interleaved M-RoPE): images of two sizes and a text-only
prompt in one batch, then two images in one prompt either way round, equal
transformers token for token (float32). Prompts run in chunks of at most
CHUNK tokens, the first ending inside the image, so the delta-net states carry
across an image; the second batch's prompts share a cached first block with
the first batch's. The MoE's engine is compiled (dynamo's eager backend) and
compiles nothing after warmup; the dense one's runs eagerly. Transformers with
the image tokens' rows and columns left out of M-RoPE gives other tokens."""

from typing import Any

from vllm import LLM

from e2e.harness import (
    EngineSpec,
    compiled_graphs,
    counted,
    counters,
    engine_spec,
    one_bucket,
    uses_engines,
)
from e2e.test_qwen_vl import (
    SHORT,
    TEXT_ONLY,
    TWO_IMAGES,
    Requests,
    expected,
    hf_greedy,
    hf_model,
    image,
    processor,
    vllm_greedy,
)

MODEL = "tiny-qwen3.5-moe-vl"
DENSE = "tiny-qwen3.5-vl"
BLOCK = 16
CHUNK = 16
OPTIONS: dict[str, Any] = dict(
    block_size=BLOCK,
    max_model_len=96,
    enable_chunked_prefill=True,
    max_num_batched_tokens=CHUNK,
    max_num_seqs=3,
    limit_mm_per_prompt={"image": 2},
    # Every block's state stays cached (vLLM's default keeps only each
    # prompt's last boundary): the first block's is hit.
    prefix_cache_retention_interval=None,
)
COMPILED = engine_spec(
    MODEL,
    name="qwen3.5-moe-images-compiled",
    enforce_eager=False,
    # Prompt chunks of 16 tokens after up to 4 context blocks, decodes of up
    # to 4 rows over the cache's blocks.
    env={
        "VLLM_HPU_COMPILE_BACKEND": "eager",
        **one_bucket("PROMPT_SEQ", CHUNK),
        **one_bucket("PROMPT_BLOCK", 4),
        **one_bucket("DECODE_BS", 4),
    },
    **OPTIONS,
)
EAGER = engine_spec(DENSE, name="qwen3.5-images", enforce_eager=True, **OPTIONS)


@uses_engines(COMPILED, EAGER)
def test_qwen3_5_images_match_transformers(llm: LLM, shared_engine: EngineSpec) -> None:
    model = shared_engine.model
    qwen = processor(model)
    ids = qwen(text=SHORT, images=[image(1)])["input_ids"][0]
    image_tokens = [i for i, t in enumerate(ids) if t == qwen.image_token_id]
    assert image_tokens[0] < CHUNK <= image_tokens[-1]
    batches: list[Requests] = [
        [(SHORT, (1,)), (SHORT, (2,)), (TEXT_ONLY, ())],
        [(TWO_IMAGES, (1, 2)), (TWO_IMAGES, (2, 1))],
    ]
    before, warmed = counters(llm), compiled_graphs()
    outputs: list[Any] = [vllm_greedy(llm, requests) for requests in batches]
    assert outputs == [expected(model, tuple(requests)) for requests in batches]
    assert outputs[1][0] != outputs[1][1]  # the order of the images matters
    assert counted(before, counters(llm), "vllm:prefix_cache_hits") >= BLOCK
    if shared_engine == COMPILED:
        assert warmed > 0 and compiled_graphs() == warmed


def _time_positions_only(hf: Any) -> None:
    """Every rotary frequency on the temporal position: image tokens lose their
    rows and columns."""
    rotary = hf.model.language_model.rotary_emb
    rotary.mrope_section = [sum(rotary.mrope_section), 0, 0]


def test_qwen3_5_image_positions_change_the_reference() -> None:
    """The image tokens' M-RoPE rows and columns decide the tokens, so the test
    above checks the positions the runner feeds."""
    with_positions = expected(MODEL, ((SHORT, (1,)),))
    hf = hf_model(MODEL, _time_positions_only)
    assert [hf_greedy(hf, MODEL, SHORT, (1,))] != with_positions
