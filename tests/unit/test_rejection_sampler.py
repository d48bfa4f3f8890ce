"""The plain-torch rejection sampler: greedy verification, and seeded random
sampling that keeps the target distribution (a tiny vocabulary, many draws);
speculative methods the runner lacks are refused."""

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID
from vllm.v1.sample.sampler import Sampler

from vllm_hpu.worker.spec_decode.decoder import spec_decode_metadata
from vllm_hpu.worker.spec_decode.methods import check_speculative_config
from vllm_hpu.worker.spec_decode.rejection_sampler import HpuRejectionSampler

VOCAB = 4
TARGET = torch.tensor([0.1, 0.2, 0.3, 0.4])
DRAFT = torch.tensor([0.4, 0.3, 0.2, 0.1])
NUM_DRAWS = 20000
# Standard error of a frequency over 20000 draws is at most 0.0036: five of them.
TOLERANCE = 0.018


def sampling_metadata(temperatures: list[float], seed: int = 0) -> SamplingMetadata:
    batch = len(temperatures)
    all_greedy = all(t == 0 for t in temperatures)
    generator = torch.Generator().manual_seed(seed)
    return SamplingMetadata(
        temperature=None if all_greedy else torch.tensor(temperatures),
        all_greedy=all_greedy,
        all_random=all(t > 0 for t in temperatures),
        top_p=None,
        top_k=None,
        generators={0: generator},  # row 0 seeded, the others from the global RNG
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def test_greedy_accepts_up_to_the_first_mismatch():
    # Row 0 rejects its third draft, row 1 has none, row 2 rejects its first:
    # each row's draft positions then its bonus position.
    argmax = [2, 1, 3, 0, 1, 3, 2, 0]
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), VOCAB).float()
    drafts = [[2, 1, 0], [], [0, 2]]
    metadata = spec_decode_metadata(drafts, torch.device("cpu"))
    sampler = HpuRejectionSampler(Sampler())
    output = sampler(metadata, None, logits, sampling_metadata([0.0, 0.0, 0.0]))
    p = PLACEHOLDER_TOKEN_ID
    assert output.sampled_token_ids.tolist() == [
        [2, 1, 3, p],
        [1, p, p, p],
        [3, p, p, p],
    ]


def test_greedy_all_accepted_takes_the_bonus_token():
    logits = torch.nn.functional.one_hot(torch.tensor([3, 1, 2]), VOCAB).float()
    metadata = spec_decode_metadata([[3, 1]], torch.device("cpu"))
    sampler = HpuRejectionSampler(Sampler())
    output = sampler(metadata, None, logits, sampling_metadata([0.0]))
    assert output.sampled_token_ids.tolist() == [[3, 1, 2]]


def draw(draft_probs: torch.Tensor | None, drafts: list[int]) -> torch.Tensor:
    """NUM_DRAWS requests of one draft each over TARGET; their first tokens."""
    metadata = spec_decode_metadata([[d] for d in drafts], torch.device("cpu"))
    # Each request: its draft position then its bonus position, both TARGET.
    logits = TARGET.log().expand(2 * len(drafts), VOCAB).contiguous()
    sampler = HpuRejectionSampler(Sampler())
    temperatures = [1.0] * len(drafts)
    output = sampler(metadata, draft_probs, logits, sampling_metadata(temperatures))
    return output.sampled_token_ids[:, 0]


@pytest.mark.parametrize("proposer", ["ngram", "distribution"])
def test_random_sampling_keeps_the_target_distribution(proposer):
    torch.manual_seed(0)
    if proposer == "ngram":  # a fixed draft without a distribution
        draft_probs, drafts = None, [1] * NUM_DRAWS
    else:  # drafts drawn from DRAFT, which the sampler corrects towards TARGET
        drafts = torch.multinomial(DRAFT, NUM_DRAWS, replacement=True).tolist()
        draft_probs = DRAFT.expand(NUM_DRAWS, VOCAB).contiguous()
    first = draw(draft_probs, drafts)
    frequencies = torch.bincount(first.long(), minlength=VOCAB).float() / NUM_DRAWS
    torch.testing.assert_close(frequencies, TARGET, atol=TOLERANCE, rtol=0)


def test_seeded_request_draws_the_same_tokens():
    def first_tokens() -> list[int]:
        metadata = spec_decode_metadata([[1, 2, 3]], torch.device("cpu"))
        logits = TARGET.log().expand(4, VOCAB).contiguous()
        sampler = HpuRejectionSampler(Sampler())
        output = sampler(metadata, None, logits, sampling_metadata([1.0], seed=5))
        return output.sampled_token_ids.tolist()

    assert all(first_tokens() == first_tokens() for _ in range(5))


@pytest.mark.parametrize(
    ("method", "pipeline", "refusal"),
    [
        ("medusa", 1, "'medusa' speculative decoding method"),
        ("suffix", 1, "'suffix' speculative decoding method"),
        ("ngram", 2, "pipeline parallelism"),
        ("draft_model", 1, "probabilistic"),
        ("eagle", 1, "probabilistic"),
        ("eagle3", 1, "probabilistic"),
        ("mtp", 1, "probabilistic"),
    ],
)
def test_unsupported_speculative_configs_are_refused(method, pipeline, refusal):
    spec = SimpleNamespace(
        method=method,
        draft_sample_method="probabilistic",
        use_heterogeneous_vocab=False,
        parallel_drafting=False,
        rejection_sample_method="standard",
        draft_lm_head_quantization=None,  # vLLM 0.33's; read there only
    )
    config = SimpleNamespace(
        speculative_config=spec,
        parallel_config=SimpleNamespace(pipeline_parallel_size=pipeline),
    )
    with pytest.raises(ValueError, match=refusal):
        check_speculative_config(config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lora", "multimodal", "draft_tp", "refusal"),
    [
        (True, False, 1, "LoRA adapters"),
        (False, True, 1, "a multimodal target"),
        (False, False, 2, "a draft_tensor_parallel_size"),
    ],
)
@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "mtp"])
def test_draft_targets_not_run_yet_are_refused(
    method, lora, multimodal, draft_tp, refusal
):
    spec = SimpleNamespace(
        method=method,
        draft_sample_method="greedy",
        use_heterogeneous_vocab=False,
        parallel_drafting=False,
        rejection_sample_method="standard",
        draft_lm_head_quantization=None,  # vLLM 0.33's; read there only
        draft_parallel_config=SimpleNamespace(tensor_parallel_size=draft_tp),
        draft_model_config=SimpleNamespace(architectures=["DeepSeekMTPModel"]),
        use_multi_module_mtp=lambda: False,
    )
    config = SimpleNamespace(
        speculative_config=spec,
        lora_config=object() if lora else None,
        model_config=SimpleNamespace(is_multimodal_model=multimodal),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=1, tensor_parallel_size=1
        ),
    )
    with pytest.raises(
        ValueError, match=f"{method} proposer does not run with {refusal}"
    ):
        check_speculative_config(config)  # type: ignore[arg-type]


def test_draft_model_with_other_kv_heads_is_refused():
    def model_config(kv_heads: int) -> SimpleNamespace:
        return SimpleNamespace(
            is_multimodal_model=False,
            get_num_kv_heads=lambda parallel: kv_heads,
            get_head_size=lambda: 64,
        )

    spec = SimpleNamespace(
        method="draft_model",
        draft_sample_method="greedy",
        use_heterogeneous_vocab=False,
        parallel_drafting=False,
        rejection_sample_method="standard",
        draft_lm_head_quantization=None,  # vLLM 0.33's; read there only
        draft_parallel_config=SimpleNamespace(tensor_parallel_size=1),
        draft_model_config=model_config(2),
    )
    config = SimpleNamespace(
        speculative_config=spec,
        lora_config=None,
        model_config=model_config(3),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=1, tensor_parallel_size=1
        ),
    )
    with pytest.raises(
        ValueError, match=r"draft has .* \(2, 64\), the target \(3, 64\)"
    ):
        check_speculative_config(config)  # type: ignore[arg-type]
    spec.draft_model_config = model_config(3)
    check_speculative_config(config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("architecture", "several_layers", "refusal"),
    [
        ("DeepSeekMTPModel", True, "num_speculative_tokens to 1"),
        ("Glm4MoeMTP", False, r"not yet this model's \(Glm4MoeMTP\)"),
    ],
)
def test_mtp_outside_what_was_validated_is_refused(
    architecture, several_layers, refusal
):
    """Several MTP layers chained, or another family's MTP layer."""
    spec = SimpleNamespace(
        method="mtp",
        draft_sample_method="greedy",
        use_heterogeneous_vocab=False,
        parallel_drafting=False,
        rejection_sample_method="standard",
        draft_lm_head_quantization=None,  # vLLM 0.33's; read there only
        draft_parallel_config=SimpleNamespace(tensor_parallel_size=1),
        draft_model_config=SimpleNamespace(architectures=[architecture]),
        use_multi_module_mtp=lambda: several_layers,
    )
    config = SimpleNamespace(
        speculative_config=spec,
        lora_config=None,
        model_config=SimpleNamespace(is_multimodal_model=False),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=1, tensor_parallel_size=1
        ),
    )
    with pytest.raises(ValueError, match=refusal):
        check_speculative_config(config)  # type: ignore[arg-type]
