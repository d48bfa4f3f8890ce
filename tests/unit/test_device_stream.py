"""The device stream: work runs in submission order, on a worker thread in
emulation (the host goes on meanwhile) or inline (Gaudi, async off)."""

import threading

import pytest
import torch

from vllm_hpu.device_stream import DeviceStream


def test_device_stream_threaded_returns_before_the_work_runs():
    stream = DeviceStream(threaded=True)
    host_went_on = threading.Event()
    ran = stream.submit(host_went_on.wait, 10.0)  # the work waits for the host
    host_went_on.set()
    assert ran.result() is True


def test_device_stream_inline_runs_the_work_in_submit():
    stream = DeviceStream(threaded=False)
    host_went_on = threading.Event()
    ran = stream.submit(host_went_on.wait, 0.0)
    assert ran.done() and ran.result() is False


@pytest.mark.parametrize("threaded", [True, False])
def test_device_stream_runs_work_in_submission_order(threaded):
    stream = DeviceStream(threaded)
    ran: list[int] = []
    for step in range(100):
        stream.submit(ran.append, step)
    stream.synchronize()
    assert ran == list(range(100))


@pytest.mark.parametrize("threaded", [True, False])
def test_device_stream_failure_reaches_its_future_and_the_stream_goes_on(threaded):
    stream = DeviceStream(threaded)
    failed = stream.submit(torch.zeros(2).__getitem__, 5)
    after = stream.submit(torch.ones, 2)
    with pytest.raises(IndexError):
        failed.result()
    torch.testing.assert_close(after.result(), torch.ones(2))
    assert stream.busy_s > 0


def test_device_stream_work_runs_without_autograd():
    stream = DeviceStream(threaded=True)
    assert stream.submit(torch.is_grad_enabled).result() is False


def test_device_stream_work_sees_the_submitters_context():
    """torch keeps its dynamo config in context variables: queued work must
    compile under the recompile limit the runner set on the host thread."""
    dynamo_config = torch._dynamo.config
    limit = dynamo_config.recompile_limit
    dynamo_config.recompile_limit = limit + 1
    try:
        stream = DeviceStream(threaded=True)
        seen = stream.submit(lambda: dynamo_config.recompile_limit).result()
    finally:
        dynamo_config.recompile_limit = limit
    assert seen == limit + 1
