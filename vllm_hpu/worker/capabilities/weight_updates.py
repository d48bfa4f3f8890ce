"""Weight updates from a trainer (``weight_transfer_config``): vLLM's
``init_weight_transfer_engine``, then per round ``start_weight_update``,
``update_weights`` (chunks) and ``finish_weight_update``, handed to the engine
vLLM builds for backend ``"hpu"`` (``distributed/weight_transfer.py``)."""

from collections.abc import Iterable
from typing import Any

import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload.inplace import reload_weights

from vllm_hpu.worker.capabilities.sleep import HpuSleepMode


def weights_change(vllm_config: VllmConfig) -> bool:
    """Whether the weights may leave the device or be replaced after loading
    (sleep mode, a weight transfer engine): they then stay in vLLM's layout."""
    return (
        vllm_config.model_config.enable_sleep_mode
        or vllm_config.weight_transfer_config is not None
    )


def reload_model_weights(
    vllm_config: VllmConfig,
    model: torch.nn.Module,
    packed: bool,
    weights_iterator: Iterable[tuple[str, torch.Tensor]] | None = None,
    weights_path: str | None = None,
    is_checkpoint_format: bool = True,
) -> None:
    """vLLM's in-place reload from ``weights_iterator``, ``weights_path`` or the
    model's checkpoint; ``packed``: linear layers were repacked for the CPU."""
    if packed:
        raise RuntimeError(
            "reload_weights cannot load into the linear layers packed for the "
            "CPU at start-up: start vLLM with enable_sleep_mode=True or a "
            "weight_transfer_config, which keep vLLM's layout."
        )
    with set_current_vllm_config(vllm_config):
        reload_weights(
            vllm_config, model, weights_iterator, weights_path, is_checkpoint_format
        )


class WeightUpdates:
    """One worker's weight-update sessions, as vLLM's GPU worker runs them."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        torch_device: torch.device,
        model: torch.nn.Module,
        sleep: HpuSleepMode,
        rank: int,
    ):
        config = vllm_config.weight_transfer_config
        assert config is not None
        self.vllm_config = vllm_config
        self.engine = WeightTransferEngineFactory.create_engine(
            config, vllm_config, torch_device, model
        )
        self.sleep = sleep
        self.rank = rank
        self.active = False

    def init_engine(self, init_info: dict[str, Any]) -> None:
        self.engine.init_transfer_engine(self.engine.parse_init_info(init_info))

    def start(self) -> None:
        if self.active:
            raise RuntimeError(
                "start_weight_update called while a weight update is active: "
                "call finish_weight_update first."
            )
        self.sleep.check_awake("start_weight_update")
        with set_current_vllm_config(self.vllm_config):
            self.engine.start_weight_update()
        self.active = True

    def update(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        """One chunk; a list holds one entry per worker, by global rank."""
        if not self.active:
            raise RuntimeError("start_weight_update must come before update_weights.")
        if isinstance(update_info, list):
            parallel = self.vllm_config.parallel_config
            index = parallel.data_parallel_index * parallel.world_size + self.rank
            update_info = update_info[index]
        try:
            with set_current_vllm_config(self.vllm_config):
                self.engine.update_weights(update_info)
        except BaseException:
            self.active = False
            raise

    def finish(self) -> None:
        if not self.active:
            raise RuntimeError(
                "finish_weight_update called without a start_weight_update."
            )
        with set_current_vllm_config(self.vllm_config):
            self.engine.finish_weight_update()
        self.active = False

    def shutdown(self) -> None:
        if self.active:
            raise RuntimeError("Cannot release the trainer during a weight update.")
        self.engine.shutdown()
