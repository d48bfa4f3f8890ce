"""Which of --(no-)async-scheduling, VLLM_DELAYED_SAMPLING and vLLM's default is in
force, and the one INFO line that says so (or why async is off)."""

import logging

import pytest
from models import model_path


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model_path("tiny-llama"), dtype="float32", **kwargs
    ).create_engine_config()


@pytest.mark.parametrize(
    ("variable", "cli", "expected", "message"),
    [
        (None, None, True, "Async scheduling on (vLLM's default)."),
        ("false", None, False, "Async scheduling off (VLLM_DELAYED_SAMPLING=False)."),
        ("true", None, True, "Async scheduling on (VLLM_DELAYED_SAMPLING=True)."),
        (
            "true",
            False,
            False,
            "Async scheduling off (--async-scheduling / --no-async-scheduling).",
        ),
        (
            "false",
            True,
            True,
            "Async scheduling on (--async-scheduling / --no-async-scheduling).",
        ),
    ],
)
def test_async_scheduling_source_in_force_is_logged(
    hpu_env, vllm_log, variable, cli, expected, message
):
    if variable is not None:
        hpu_env(VLLM_DELAYED_SAMPLING=variable)
    config = _engine_config(async_scheduling=cli)
    assert config.scheduler_config.async_scheduling is expected
    assert message in vllm_log.messages(logging.INFO)


def test_async_scheduling_off_for_speculative_decoding(vllm_log):
    draft = {"model": model_path("tiny-llama"), "num_speculative_tokens": 2}
    config = _engine_config(speculative_config=draft)
    assert config.speculative_config.method == "draft_model"
    assert config.scheduler_config.async_scheduling is False
    assert [m for m in vllm_log.messages(logging.INFO) if "Async sched" in m] == [
        "Async scheduling disabled: the HPU runner does not combine it with "
        "speculative decoding yet."
    ]
