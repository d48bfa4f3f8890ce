"""Per-step diagnostics: plugin metrics, the step profiler, graph compilations and
CPU fallbacks."""
