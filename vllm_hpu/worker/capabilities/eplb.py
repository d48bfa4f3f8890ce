"""Expert load balancing (``--enable-eplb``): vLLM's own EPLB (its EplbState,
policy and weight exchange, through the controller its GPU runner uses) at the
plugin's hook points. The MoE layers' routing (ops/fused_moe.py::route) maps
each token's experts onto physical replicas and counts their load; here:

- load: the state is made before the model, which then registers its experts;
- each pass: its real token count, so padding counts no load;
- each engine step (the worker's ``sample_tokens``, ``execute_model`` of a
  pooling model, ``execute_dummy_batch`` as a dummy step): vLLM's step, which
  every ``step_interval`` steps rearranges the experts among the ranks. It
  runs on the device stream, behind the step's passes and before the next
  step's, which read the moved weights.
"""

from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.eplb_utils import EPLBController

from vllm_hpu.emulation.device_stream import DeviceStream


class ExpertBalancing:
    """What the runner and worker ask of expert load balancing; without
    --enable-eplb (this class) the experts stay where they were loaded."""

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
