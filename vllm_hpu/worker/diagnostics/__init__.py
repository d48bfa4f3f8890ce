"""Per-step diagnostics: graph compilations and CPU fallbacks."""
