"""vLLM's logprob rank count runs without torch.compile once the plugin is
registered (patches/logprobs.py): a compile there would happen on the first
request with logprobs, after warmup."""

import torch


def test_rank_count_is_not_compiled_and_counts_ranks():
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs

    import vllm_hpu

    vllm_hpu.register_ops()
    count = sampler.batched_count_greater_than
    assert count is logprobs.batched_count_greater_than
    assert not hasattr(count, "_torchdynamo_orig_callable")
    values = torch.randn(3, 10).log_softmax(-1)
    sampled = values[:, 4:5]
    assert count(values, sampled).tolist() == (values >= sampled).sum(-1).tolist()
