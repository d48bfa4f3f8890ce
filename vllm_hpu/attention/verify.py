"""Packing of a verification pass: each row's ``q <= Q`` tokens (last sampled
token and drafts) take consecutive slots of one of ``bs`` groups of ``Q``,
rows with few drafts sharing groups so little is padded; causal within rows."""


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
