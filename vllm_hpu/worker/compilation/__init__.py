"""Compilation and graphs, owned by the runner: the execution mode, which buckets
are captured within the graph memory budget, the compile cache, graph splits
between layers."""
