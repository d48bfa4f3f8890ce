"""Streams and events (bridge hpu/streams.py, hpu/events.py): the emulated
device runs work inline, so a stream orders nothing and an event is complete
as soon as it is recorded."""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Event", "Stream", "current_stream", "default_stream", "stream"]


class Stream:
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("hpu", 0)
        self.priority = priority
        self.is_capture = False

    def synchronize(self) -> None:
        import habana_frameworks.torch.hpu as hpu

        hpu.synchronize()

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: "Stream") -> None:
        return None

    def wait_event(self, event: "Event") -> None:
        return None

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event


class Event:
    def __init__(self, enable_timing: bool = False, **kwargs: Any) -> None:
        self.recorded = False

    def record(self, stream: Stream | None = None) -> None:
        self.recorded = True

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


_default = Stream()


def default_stream(device: Any = None) -> Stream:
    return _default


def current_stream(device: Any = None) -> Stream:
    return _default


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    yield
