"""Per-request state across steps, mirrored into vLLM's InputBatch: applies what
the scheduler sends as changed (new, resumed, preempted, finished requests,
block ids, computed counts); ``InputBatch`` builds the sampling metadata."""

import torch
from vllm.config import VllmConfig
from vllm.sampling_params import SamplingType
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch


def make_input_batch(vllm_config: VllmConfig, device: torch.device) -> InputBatch:
    """vLLM's batch rows, sized by the scheduler's limits, one KV cache group."""
    model_config = vllm_config.model_config
    max_model_len = model_config.max_model_len
    block_size = vllm_config.cache_config.block_size
    is_pooling_model = model_config.runner_type == "pooling"
    return InputBatch(
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        device=device,
        vocab_size=model_config.get_vocab_size(),
        block_sizes=[block_size],
        max_num_blocks_per_req=[-(-max_model_len // block_size)],
        logitsprocs=build_logitsprocs(vllm_config, device, False, is_pooling_model, ()),
        is_pooling_model=is_pooling_model,
    )


class RequestStates:
    def __init__(self, input_batch: InputBatch, device: torch.device):
        self.input_batch = input_batch
        self.device = device
        self.requests: dict[str, CachedRequestState] = {}
        # Requests asking for prompt logprobs, with how many per position.
        self.num_prompt_logprobs: dict[str, int] = {}

    def update(self, scheduler_output: SchedulerOutput) -> None:
        """Apply a step's scheduler output; the rows are then its scheduled requests."""
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.num_prompt_logprobs.pop(req_id, None)
            batch.remove_request(req_id)
        cached = scheduler_output.scheduled_cached_reqs
        # Unscheduled (preempted or skipped) requests leave the batch but keep
        # their state; a resumed request re-enters with its new block ids.
        scheduled = (
            scheduler_output.num_scheduled_tokens.keys() - cached.resumed_req_ids
        )
        for req_id in batch.req_id_to_index.keys() - scheduled:
            batch.remove_request(req_id)

        to_add = [self._add_new(new) for new in scheduler_output.scheduled_new_reqs]
        to_add += self._update_cached(scheduler_output)
        for state in to_add:
            batch.add_request(state)
        batch.condense()
        batch.refresh_metadata()

    def _add_new(self, new: NewRequestData) -> CachedRequestState:
        params = new.sampling_params
        generator = None
        if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
            assert params.seed is not None, "a seeded request carries its seed"
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        if params is not None and params.prompt_logprobs is not None:
            vocab_size = self.input_batch.vocab_size
            count = params.prompt_logprobs
            self.num_prompt_logprobs[new.req_id] = vocab_size if count == -1 else count
        state = CachedRequestState(
            req_id=new.req_id,
            prompt_token_ids=new.prompt_token_ids,
            prompt_embeds=new.prompt_embeds,
            mm_features=new.mm_features,
            sampling_params=params,
            pooling_params=new.pooling_params,
            generator=generator,
            block_ids=new.block_ids,
            num_computed_tokens=new.num_computed_tokens,
            output_token_ids=[],
            lora_request=new.lora_request,
        )
        self.requests[new.req_id] = state
        return state

    def _update_cached(
        self, scheduler_output: SchedulerOutput
    ) -> list[CachedRequestState]:
        """Update running and resumed requests; return those not in the batch."""
        cached = scheduler_output.scheduled_cached_reqs
        batch = self.input_batch
        to_add = []
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_block_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                assert new_block_ids is not None
                state.block_ids = new_block_ids
            elif new_block_ids is not None:
                for block_ids, new_ids in zip(
                    state.block_ids, new_block_ids, strict=True
                ):
                    block_ids.extend(new_ids)
            echoed = self._echoed_tokens(
                state, cached.new_token_ids[i] if cached.new_token_ids else []
            )
            row = batch.req_id_to_index.get(req_id)
            if row is None:
                state.output_token_ids.extend(echoed)
                to_add.append(state)
                continue
            for token_id in echoed:
                self.append_sampled(row, token_id)
            batch.num_computed_tokens_cpu[row] = state.num_computed_tokens
            if new_block_ids is not None:
                batch.block_table.append_row(new_block_ids, row)
        return to_add

    @staticmethod
    def _echoed_tokens(state: CachedRequestState, token_ids: list[int]) -> list[int]:
        """Tokens sampled since this stage last saw the request: stages before the last
        never sample, so they take the tail of the scheduled tokens."""
        num_new = state.num_computed_tokens + len(token_ids) - state.num_tokens
        return token_ids[len(token_ids) - num_new :] if num_new > 0 else []

    def rows_inside_prompt(self, scheduler_output: SchedulerOutput) -> list[int]:
        """Rows whose scheduled tokens stop short of the end of their prompt."""
        rows = []
        for row, req_id in enumerate(self.input_batch.req_ids):
            state = self.requests[req_id]
            scheduled = scheduler_output.num_scheduled_tokens[req_id]
            if state.num_computed_tokens + scheduled < state.num_tokens:
                rows.append(row)
        return rows

    def append_sampled(self, row: int, token_id: int) -> None:
        """Record a sampled token; the runner feeds it back on the next step."""
        batch = self.input_batch
        req_id = batch.req_ids[row]
        end = batch.num_tokens_no_spec[row]
        batch.token_ids_cpu[row, end] = token_id
        batch.is_token_ids[row, end] = True
        batch.num_tokens_no_spec[row] = end + 1
        self.requests[req_id].output_token_ids.append(token_id)
