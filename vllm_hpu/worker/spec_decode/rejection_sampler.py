"""vLLM's RejectionSampler with its triton kernels in plain torch (Leviathan et
al., arXiv 2211.17192): bonus sampling, logits processors and logprobs are
vLLM's; only expand, acceptance and recovered-token kernels are here."""

from dataclasses import replace

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
from vllm.v1.sample.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    generate_uniform_probs,
)
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata


class HpuRejectionSampler(RejectionSampler):
    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> SamplerOutput:
        """``logits`` [num_draft_tokens + batch_size, vocab]: draft then bonus positions
        per request; ``draft_probs`` None without a distribution (n-gram)."""
        bonus = self.sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits"
            if self.is_processed_logprobs_mode
            else "raw_logits",
        )
        raw_target = logits[metadata.target_logits_indices].to(torch.float32)
        target = raw_target if self.is_processed_logprobs_mode else raw_target.clone()
        target = self.apply_logits_processors(target, sampling_metadata, metadata)
        target = _apply_sampling_constraints(target, metadata, sampling_metadata)
        output = rejection_sample(
            metadata, draft_probs, target, bonus.sampled_token_ids, sampling_metadata
        )
        logprobs = None
        if sampling_metadata.max_num_logprobs is not None:
            assert bonus.logprobs_tensors is not None
            logprobs = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs,
                metadata,
                logits,
                target if self.is_processed_logprobs_mode else raw_target,
                bonus.logprobs_tensors.logprobs,
                output,
            )
        return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs)


def _per_token(x: torch.Tensor, num_draft_tokens: list[int]) -> torch.Tensor:
    """A per-request tensor repeated for each of the request's draft tokens."""
    counts = torch.tensor(num_draft_tokens, device=x.device)
    return x.repeat_interleave(counts, dim=0)


def _apply_sampling_constraints(
    logits: torch.Tensor,
    metadata: SpecDecodeMetadata,
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """Temperature, top-k and top-p of each request on its draft positions."""
    if sampling_metadata.all_greedy:
        return logits
    counts = metadata.num_draft_tokens
    assert sampling_metadata.temperature is not None, "set unless all greedy"
    temperature = _per_token(sampling_metadata.temperature, counts)
    # Greedy rows (temperature 0) are verified by argmax, which scaling keeps.
    temperature = torch.where(temperature == 0, 1.0, temperature)
    logits.div_(temperature.unsqueeze(-1).to(logits.dtype))
    top_k, top_p = sampling_metadata.top_k, sampling_metadata.top_p
    return apply_top_k_top_p_pytorch(
        logits,
        None if top_k is None else _per_token(top_k, counts),
        None if top_p is None else _per_token(top_p, counts),
        allow_cpu_sync=True,
    )


def rejection_sample(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """[batch_size, max_spec_len + 1]: accepted drafts, then the target's token at the
    first rejection (or the bonus); ``PLACEHOLDER_TOKEN_ID`` after."""
    counts = metadata.num_draft_tokens
    device = target_logits.device
    output = torch.full(
        (len(counts), metadata.max_spec_len + 1),
        PLACEHOLDER_TOKEN_ID,
        dtype=torch.int32,
        device=device,
    )
    drafts = metadata.draft_token_ids.long()
    greedy_tokens = target_logits.argmax(dim=-1)
    accepted, fallback = drafts == greedy_tokens, greedy_tokens
    if not sampling_metadata.all_greedy:
        assert sampling_metadata.temperature is not None, "set unless all greedy"
        generators = sampling_metadata.generators
        uniform = generate_uniform_probs(sum(counts), counts, generators, device)
        probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        # Greedy rows of a mixed batch keep the argmax rule.
        is_random = _per_token(sampling_metadata.temperature > 0, counts)
        accepted = torch.where(
            is_random, _accepted_random(probs, draft_probs, drafts, uniform), accepted
        )
        recovered = _recovered_tokens(probs, draft_probs, drafts, counts, generators)
        fallback = torch.where(is_random, recovered, greedy_tokens)
    drafts_list, accepted_list = drafts.tolist(), accepted.tolist()
    start = 0
    for i, count in enumerate(counts):
        end = start + count
        _fill_row(
            output[i],
            drafts_list[start:end],
            accepted_list[start:end],
            fallback[start:end],
            bonus_token_ids[i],
        )
        start = end
    return output


def _fill_row(
    row: torch.Tensor,
    drafts: list[int],
    accepted: list[bool],
    fallback: torch.Tensor,
    bonus: torch.Tensor,
) -> None:
    """Accepted drafts up to the first rejection, which takes ``fallback``'s
    token; the bonus token when every draft is accepted."""
    num_accepted = next((j for j, ok in enumerate(accepted) if not ok), len(drafts))
    row[:num_accepted] = torch.tensor(drafts[:num_accepted], dtype=row.dtype)
    if num_accepted < len(drafts):
        row[num_accepted] = fallback[num_accepted]
    else:
        row[num_accepted] = bonus.reshape(())


def _accepted_random(
    probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    drafts: torch.Tensor,
    uniform: torch.Tensor,
) -> torch.Tensor:
    """Accept draft x with probability min(1, p(x) / q(x)); n-gram: q(x) = 1."""
    target_p = probs.gather(1, drafts.unsqueeze(1)).squeeze(1)
    if draft_probs is None:
        return target_p >= uniform
    draft_p = draft_probs.gather(1, drafts.unsqueeze(1)).squeeze(1)
    return (draft_p > 0) & (target_p / draft_p >= uniform)


def _recovered_tokens(
    probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    drafts: torch.Tensor,
    counts: list[int],
    generators: dict[int, torch.Generator],
) -> torch.Tensor:
    """A token from norm(max(p - q, 0)) per draft position, as argmax(weight / E), E ~
    Exp(1), one E per request from its generator, as vLLM draws it."""
    if draft_probs is None:
        residual = probs.scatter(1, drafts.unsqueeze(1), 0.0)
    else:
        residual = (probs - draft_probs).clamp_min(0.0)
    noise = torch.empty((len(counts), probs.shape[1]), device=probs.device)
    noise.exponential_()
    for i, generator in generators.items():
        if counts[i] > 0:
            noise[i].exponential_(generator=generator)
    return (residual * _per_token(noise.reciprocal(), counts)).argmax(dim=-1)
