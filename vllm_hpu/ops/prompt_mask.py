"""The mask of a prompt pass, kept per token ([bs, q] queries, [bs, K] keys) and
made per tile, never [q, K] at once. One form serves padded batches, merged
passes (block-diagonal) and encoder rows (bidirectional); padding has owner -1
and sees only itself, so padded rows come out finite."""

from dataclasses import dataclass

import torch

from vllm_hpu.ops.score_mods import alibi_bias

NO_OWNER = -1  # padding queries, padding keys, cached slots past a prompt's context
# Key codes owner * OWNER_STRIDE + position: positions stay far below it.
OWNER_STRIDE = 1 << 40


@dataclass(frozen=True)
class PromptMask:
    """Per-token owners and positions; key ``past_len + t`` is current query ``t``."""

    query_owner: torch.Tensor  # [bs, q] long
    query_position: torch.Tensor  # [bs, q] long
    key_owner: torch.Tensor  # [bs, K] long: cached context keys, then the q queries
    key_position: torch.Tensor  # [bs, K] long
    causal: bool = True
    # [bs, q] long: the last position each query sees when causal, past its own
    # inside a bidirectional span (the span's last); None: its own position.
    query_span_end: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.query_owner.shape[0]

    @property
    def query_len(self) -> int:
        return self.query_owner.shape[1]

    @property
    def num_keys(self) -> int:
        return self.key_owner.shape[1]

    @property
    def past_len(self) -> int:
        return self.num_keys - self.query_len

    def allowed(
        self,
        queries: slice,
        keys: slice,
        sliding_window: int | None = None,
        attention_chunk: int | None = None,
    ) -> torch.Tensor:
        """[bs, len(queries), len(keys)] bool: which keys each query sees. Each key's
        code ``owner * OWNER_STRIDE + position`` (hidden: negative) makes a query's
        visible keys one range: two comparisons per score instead of five."""
        first, last = self._visible_codes(queries, sliding_window, attention_chunk)
        code = _key_codes(self.key_owner, self.key_position, keys)[:, None, :]
        return (code >= first[:, :, None]) & (code <= last[:, :, None])

    def _visible_codes(
        self,
        queries: slice,
        sliding_window: int | None,
        attention_chunk: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per query [bs, len(queries)]: first and last key code it sees; padding sees
        only its own (negative) code, a chunked layer's query from its chunk start."""
        owner = self.query_owner[:, queries]
        position = self.query_position[:, queries]
        base = owner * OWNER_STRIDE
        first = base
        last = base + (
            self._last_positions(queries) if self.causal else OWNER_STRIDE - 1
        )
        if sliding_window is not None:
            first = torch.maximum(first, base + position - sliding_window + 1)
        if attention_chunk is not None:
            first = torch.maximum(first, base + position - position % attention_chunk)
        own_key = (
            torch.arange(queries.start, queries.stop, device=owner.device)
            + self.past_len
        )
        padding = owner == NO_OWNER
        diagonal = _hidden_code(own_key)[None, :]
        return torch.where(padding, diagonal, first), torch.where(
            padding, diagonal, last
        )

    def _last_positions(self, queries: slice) -> torch.Tensor:
        if self.query_span_end is None:
            return self.query_position[:, queries]
        return self.query_span_end[:, queries]

    def distance(self, queries: slice, keys: slice) -> torch.Tensor:
        """[bs, len(queries), len(keys)]: key position minus query position."""
        return self.key_position[:, None, keys] - self.query_position[:, queries, None]


@dataclass(frozen=True)
class PromptBias:
    """A layer's additive score bias, made per tile: the mask (window or chunk, a
    sparse layer's chosen keys) plus ALiBi when the layer has slopes."""

    mask: PromptMask
    dtype: torch.dtype  # of the bias; ALiBi's is always fp32
    sliding_window: int | None = None
    alibi_slopes: torch.Tensor | None = None  # [num_heads] fp32
    attention_chunk: int | None = None  # Llama 4's chunked local attention
    # [bs, q, K] bool: the keys each query attends (DeepSeek-V3.2's top-k).
    selected: torch.Tensor | None = None

    @property
    def causal(self) -> bool:
        """Whether no query sees a later key (then sliced attention skips tiles)."""
        return self.mask.causal and self.mask.query_span_end is None

    def tile(self, queries: slice, keys: slice) -> torch.Tensor:
        """One tile's bias [bs, 1 or num_heads, len(queries), len(keys)]. A named
        method: Dynamo 2.11 (Gaudi 1.24's torch) cannot trace a dataclass's
        ``__call__`` made in a compiled region. Hidden keys get the dtype's most
        negative finite value, so a tile where a query sees nothing merges finitely."""
        allowed = self.mask.allowed(
            queries, keys, self.sliding_window, self.attention_chunk
        )
        if self.selected is not None:
            allowed = allowed & self.selected[:, queries, keys]
        allowed = allowed.unsqueeze(1)
        dtype = torch.float32 if self.alibi_slopes is not None else self.dtype
        bias = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)
        if self.alibi_slopes is None:
            return bias
        distance = self.mask.distance(queries, keys)
        return bias + alibi_bias(self.alibi_slopes, distance)

    def whole(self) -> torch.Tensor:
        """The bias of the whole pass, [bs, 1 or num_heads, q, K]."""
        return self.tile(slice(0, self.mask.query_len), slice(0, self.mask.num_keys))


def _hidden_code(key_ids: torch.Tensor) -> torch.Tensor:
    """A hidden key's code: negative and its own, -(key index + 1)."""
    return -(key_ids + 1)


def _key_codes(
    key_owner: torch.Tensor, key_position: torch.Tensor, keys: slice
) -> torch.Tensor:
    """[bs, len(keys)]: owner * OWNER_STRIDE + position, or the hidden code."""
    owner = key_owner[:, keys]
    key_ids = torch.arange(keys.start, keys.stop, device=owner.device)
    code = owner * OWNER_STRIDE + key_position[:, keys]
    return torch.where(owner == NO_OWNER, _hidden_code(key_ids)[None, :], code)


def padded_rows_mask(
    context_lens: torch.Tensor,
    query_lens: torch.Tensor,
    query_len: int,
    past_len: int,
    causal: bool = True,
    query_span_end: torch.Tensor | None = None,
) -> PromptMask:
    """Mask of one prompt per row: row i has ``context_lens[i]`` cached tokens (keys
    0 .. past_len - 1) and ``query_lens[i]`` real queries ([bs] long, mask device)."""
    device = query_lens.device
    offsets = torch.arange(query_len, device=device)
    past = torch.arange(past_len, device=device)
    query_position = context_lens[:, None] + offsets[None, :]
    query_owner = _owner(offsets[None, :] < query_lens[:, None])
    past_owner = _owner(past[None, :] < context_lens[:, None])
    batch_size = context_lens.shape[0]
    return PromptMask(
        query_owner=query_owner,
        query_position=query_position,
        key_owner=torch.cat((past_owner, query_owner), dim=1),
        key_position=torch.cat((past.expand(batch_size, -1), query_position), dim=1),
        causal=causal,
        query_span_end=query_span_end,
    )


def _owner(real: torch.Tensor) -> torch.Tensor:
    """Owner 0 (the row's prompt) where ``real``, else NO_OWNER."""
    return torch.where(real, 0, NO_OWNER).long()
