"""Metadata of a verification pass: each row's ``q <= Q`` tokens (its last
sampled token and its drafts) against its cached blocks in the flat decode
layout, causal among the row's own tokens.

The pass is a decode pass of ``bs`` query groups of ``Q`` slots each, slot
``j`` of group ``g`` at flat index ``g * Q + j``. A row's tokens take
consecutive slots of one group; rows with fewer than ``Q`` tokens (few or no
drafts) share groups (:func:`pack_rows`), so a batch where some rows drafted
nothing pads few tokens. A group's blocks are its rows' blocks, each biased
per slot: a slot sees only its own row's keys. Keys and values are written
first (``slot_mapping``, as decode does), so each query reads its own row's
new tokens from the cache: query ``j`` of a row with context ``c`` sees key
positions up to ``c + j`` (within its window or chunk). A group's free slots
repeat its last row's last query; padding groups and blocks are decode's.
``attention/metadata.py``'s ``build_decode_metadata`` builds the metadata of a
packing from :func:`pack_rows`.
"""


def pack_rows(query_lens: list[int], num_queries: int) -> list[int]:
    """The flat index of each row's first token: rows in order, each in the
    first group with room for all its tokens (first fit), else a new group."""
    free: list[int] = []  # free slots per group
    starts = []
    for count in query_lens:
        if count > num_queries:
            raise ValueError(f"{count} tokens do not fit {num_queries} queries per row")
        group = next((g for g, room in enumerate(free) if room >= count), len(free))
        if group == len(free):
            free.append(num_queries)
        starts.append(group * num_queries + num_queries - free[group])
        free[group] -= count
    return starts


def num_groups(starts: list[int], num_queries: int) -> int:
    """The query groups a packing from :func:`pack_rows` fills."""
    return max(starts, default=-1) // num_queries + 1
