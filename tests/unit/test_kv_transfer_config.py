"""Which KV connectors start: decided on vLLM's config before any engine starts,
including the connector vLLM derives from --kv-offloading-size after the
platform's own check."""

import importlib

import pytest
from models import model_path

from vllm_hpu.kv_transfer.connectors import (
    HPU_OFFLOADING_CONNECTOR,
    HPU_OFFLOADING_MODULE,
    HPU_OFFLOADING_SPEC,
    check_worker_config,
)


def _engine_config(**kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model_path("tiny-llama"), dtype="float32", **kwargs
    ).create_engine_config()


@pytest.mark.parametrize(
    "kv_transfer_config",
    [
        {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
        {"kv_connector": "P2pNcclConnector", "kv_role": "kv_producer"},
        {"kv_connector": "MultiConnector", "kv_role": "kv_both"},
        {"kv_connector": "NixlPushConnector", "kv_role": "kv_producer"},
        {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_connector_module_path": "my.connectors",
        },
    ],
)
def test_kv_transfer_refuses_connectors_it_does_not_run(kv_transfer_config) -> None:
    with pytest.raises(ValueError, match="does not run the KV connector"):
        _engine_config(kv_transfer_config=kv_transfer_config)


def test_kv_transfer_refuses_offloading_backends_derived_after_the_platform() -> None:
    # vLLM turns these options into a connector after the platform's check.
    with pytest.raises(ValueError, match="--kv-offloading-backend lmcache"):
        _engine_config(kv_offloading_size=1.0, kv_offloading_backend="lmcache")


def test_kv_transfer_offloading_size_runs_the_plugins_connector() -> None:
    config = _engine_config(kv_offloading_size=0.5)
    transfer = config.kv_transfer_config
    assert transfer.kv_connector == HPU_OFFLOADING_CONNECTOR
    assert transfer.kv_connector_module_path == HPU_OFFLOADING_MODULE
    extra = transfer.kv_connector_extra_config
    assert extra["spec_name"] == HPU_OFFLOADING_SPEC
    assert extra["spec_module_path"] == HPU_OFFLOADING_MODULE
    assert extra["cpu_bytes_to_use"] == 1 << 29
    assert config.scheduler_config.async_scheduling is False
    module = importlib.import_module(HPU_OFFLOADING_MODULE)
    assert hasattr(module, HPU_OFFLOADING_CONNECTOR)
    assert hasattr(module, HPU_OFFLOADING_SPEC)


def test_kv_transfer_offloading_needs_host_memory_and_a_host_spec() -> None:
    offloading = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    with pytest.raises(ValueError, match="--kv-offloading-size"):
        _engine_config(kv_transfer_config=offloading)
    with pytest.raises(ValueError, match="'TieringOffloadingSpec'"):
        _engine_config(
            kv_transfer_config={
                **offloading,
                "kv_connector_extra_config": {
                    "cpu_bytes_to_use": 1 << 20,
                    "spec_name": "TieringOffloadingSpec",
                },
            }
        )


def test_kv_transfer_nixl_reads_host_memory_in_synchronous_steps() -> None:
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    config = _engine_config(kv_transfer_config=nixl)
    assert config.kv_transfer_config.kv_buffer_device == "cpu"
    assert config.scheduler_config.async_scheduling is False
    with pytest.raises(ValueError, match="kv_buffer_device='cuda'"):
        _engine_config(kv_transfer_config={**nixl, "kv_buffer_device": "cuda"})


def test_kv_transfer_refuses_combinations_the_runner_lacks() -> None:
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    with pytest.raises(ValueError, match="KV transfer with speculative decoding"):
        _engine_config(
            kv_transfer_config=nixl,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2},
        )


def test_kv_transfer_worker_refuses_async_steps() -> None:
    config = _engine_config(kv_offloading_size=0.5)
    config.scheduler_config.async_scheduling = True  # as a hand-built config may
    with pytest.raises(ValueError, match="--no-async-scheduling"):
        check_worker_config(config)
