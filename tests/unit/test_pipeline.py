"""One message per step between pipeline stages: the passes' tensors joined along
the token axis, split back by the passes' padded sizes."""

import pytest
import torch
from vllm.sequence import IntermediateTensors

from vllm_hpu.worker.capabilities import pipeline


def _pass_output(num_tokens: int, fill: float) -> IntermediateTensors:
    return IntermediateTensors(
        {
            "hidden_states": torch.full((num_tokens, 8), fill),
            "residual": torch.full((num_tokens, 8), -fill),
        }
    )


def test_pipeline_split_returns_each_pass_as_it_was_joined():
    outputs = [_pass_output(32, 1.0), _pass_output(4, 2.0)]

    parts = pipeline.split(pipeline.join(outputs), [32, 4])

    assert len(parts) == 2
    for part, output in zip(parts, outputs, strict=True):
        assert part.tensors.keys() == output.tensors.keys()
        for key in output.tensors:
            assert torch.equal(part[key], output[key])


def test_pipeline_split_refuses_a_step_planned_differently():
    joined = pipeline.join([_pass_output(32, 1.0)])

    with pytest.raises(AssertionError, match="planned different passes"):
        pipeline.split(joined, [16, 8])
