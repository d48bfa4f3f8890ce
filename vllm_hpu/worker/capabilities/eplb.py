"""Expert load balancing (``--enable-eplb``): vLLM's own EPLB (EplbState, policy,
weight exchange) at the plugin's hooks: the state made before the model, each
pass's real token count (padding counts no load), and each engine step vLLM's
step, which rearranges the experts on the device stream, between passes."""

from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.eplb_utils import EPLBController

from vllm_hpu.emulation.device_stream import DeviceStream


class ExpertBalancing:
    """The runner's and worker's EPLB calls; without --enable-eplb (this class) none."""

    def before_load(self) -> None:
        pass

    def after_load(self, model: torch.nn.Module) -> None:
        pass

    def before_pass(self, num_real_tokens: int) -> None:
        pass

    def after_warmup(self) -> None:
        pass

    def step(self, is_dummy: bool = False) -> None:
        pass


class HpuEplb(ExpertBalancing):
    def __init__(
        self, vllm_config: VllmConfig, device: torch.device, stream: DeviceStream
    ) -> None:
        self.controller = EPLBController(vllm_config.parallel_config, device)
        self.model_config = vllm_config.model_config
        self.stream = stream

    def before_load(self) -> None:
        self.controller.prepare_load()

    def after_load(self, model: torch.nn.Module) -> None:
        self.controller.maybe_register_model(model, self.model_config)

    def before_pass(self, num_real_tokens: int) -> None:
        self.controller.prepare_forward(self.model_config, num_real_tokens)

    def after_warmup(self) -> None:
        """Warmup's passes count no load (vLLM's warmup runs are dummy steps)."""
        for model_state in self._model_states():
            model_state.expert_load_pass.zero_()

    def step(self, is_dummy: bool = False) -> None:
        self.stream.submit(self.controller.step, is_dummy).result()

    def _model_states(self) -> list[Any]:
        state = self.controller.state
        return [] if state is None else list(state.model_states.values())
