"""The bridge's torch.compile backend package (dynamo/compile_backend)."""

from habana_frameworks.torch.dynamo.compile_backend import backends  # noqa: F401
