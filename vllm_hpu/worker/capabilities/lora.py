"""LoRA for the HPU runner: vLLM's worker LoRA manager and runner mixin, with the
adapter mapping set per padded forward pass (prompt or decode) from the rows'
LoRA ids, and dummy adapters active through warmup."""

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from vllm.config import VllmConfig
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.layers import LoRAMapping
from vllm.lora.lora_model import LoRAModel
from vllm.lora.request import LoRARequest
from vllm.v1.worker.gpu_input_batch import InputBatch
from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin

from vllm_hpu.worker.passes.forward_pass import ForwardPass

WARMUP_LORA_PATH = "/not/a/real/path"  # dummy adapters are never read from disk


class LoRAAdapters:
    """What the runner asks of LoRA; without --enable-lora (this class) no
    adapter exists and none can be added."""

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        return model

    def set_pass(self, forward_pass: ForwardPass) -> None:
        pass

    def set_logits_rows(self, rows: list[int]) -> None:
        pass

    def warmup_request(self, index: int) -> LoRARequest | None:
        return None

    def dummy_adapters(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def add_lora(self, lora_request: LoRARequest) -> bool:
        raise _not_enabled()

    def remove_lora(self, lora_id: int) -> bool:
        raise _not_enabled()

    def pin_lora(self, lora_id: int) -> bool:
        raise _not_enabled()

    def list_loras(self) -> set[int]:
        raise _not_enabled()


def _not_enabled() -> RuntimeError:
    return RuntimeError("LoRA is not enabled: start vLLM with --enable-lora.")


class HpuLoRA(LoRAModelRunnerMixin, LoRAAdapters):
    """LoRA with --enable-lora; ``add_lora``, ``remove_lora``, ``pin_lora`` and
    ``list_loras`` come from vLLM's mixin."""

    def __init__(self, vllm_config: VllmConfig, input_batch: InputBatch) -> None:
        assert vllm_config.lora_config is not None, "only built with --enable-lora"
        self.lora_config = vllm_config.lora_config
        self.vllm_config = vllm_config
        self.input_batch = input_batch
        self.model: torch.nn.Module | None = None
        self.get_model = self._model

    def _model(self) -> torch.nn.Module:
        assert self.model is not None, "wrap() first"
        return self.model

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """Swap the model's LoRA-capable layers for vLLM's LoRA layers."""
        self.model = self.load_lora_model(model, self.vllm_config, device)
        self._refuse_unused_weights()
        return self.model

    def _refuse_unused_weights(self) -> None:
        """An adapter is refused as it loads (``add_lora`` or a request's
        first step) if it has weights for layers without LoRA here (MoE
        experts: patches/lora_moe.py), which would be left out silently."""
        workers = self.lora_manager
        manager = workers._adapter_manager
        load = workers._load_adapter

        def checked_load(lora_request: LoRARequest) -> LoRAModel:
            adapter = load(lora_request)
            covered = set(manager.modules).union(*manager.packed_modules.values())
            unused = sorted(set(adapter.loras) - covered)
            if unused:
                raise ValueError(
                    f"LoRA adapter '{lora_request.lora_name}' has weights for "
                    f"{', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}, "
                    "which take no LoRA on the HPU plugin (MoE experts do not)."
                )
            return adapter

        workers._load_adapter = checked_load  # type: ignore[method-assign]

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter; a failure names the adapter and its folder (vLLM's
        not-found error passes as is: the server answers it with a 404)."""
        try:
            return super().add_lora(lora_request)
        except LoRAAdapterNotFoundError:
            raise
        except Exception as error:
            raise ValueError(
                f"LoRA adapter '{lora_request.lora_name}' at "
                f"{lora_request.lora_path} could not be loaded: {error}"
            ) from error

    def set_pass(self, forward_pass: ForwardPass) -> None:
        """Activate the step's adapters and map each token of the padded pass
        to its row's adapter (0, no adapter, for padding)."""
        row_lora_ids = self.input_batch.request_lora_mapping
        token_mapping = [0] * forward_pass.num_tokens
        for first, seq in zip(
            forward_pass.first_token_indices, forward_pass.seqs, strict=True
        ):
            lora_id = int(row_lora_ids[seq.row])
            num_tokens = seq.layout.num_scheduled_tokens
            token_mapping[first : first + num_tokens] = [lora_id] * num_tokens
        prompt_mapping = tuple(int(row_lora_ids[seq.row]) for seq in forward_pass.seqs)
        requests = set(self.input_batch.lora_id_to_lora_request.values())
        mapping = LoRAMapping(tuple(token_mapping), prompt_mapping, is_prefill=True)
        self.lora_manager.set_active_adapters(requests, mapping)

    def set_logits_rows(self, rows: list[int]) -> None:
        """Map each hidden state the LM head gets next to its InputBatch row's
        adapter (the LoRA logits processor reads the sampler mapping)."""
        lora_ids = tuple(int(self.input_batch.request_lora_mapping[r]) for r in rows)
        requests = set(self.input_batch.lora_id_to_lora_request.values())
        mapping = LoRAMapping(lora_ids, lora_ids, is_prefill=False)
        self.lora_manager.set_active_adapters(requests, mapping)

    def warmup_request(self, index: int) -> LoRARequest:
        """The dummy adapter a warmup request uses: every slot in turn."""
        assert self.lora_config is not None
        lora_id = index % self.lora_config.max_loras + 1
        return LoRARequest(f"warmup_{lora_id}", lora_id, WARMUP_LORA_PATH)

    @contextmanager
    def dummy_adapters(self) -> Iterator[None]:
        """max_loras dummy adapters registered for warmup, removed after."""
        with self.maybe_setup_dummy_loras(self.lora_config, remove_lora=True):
            yield
