"""The device stream: work runs in submission order, on a worker thread in
emulation (the host goes on meanwhile) or inline (Gaudi, async off)."""

import threading

import pytest
import torch

from vllm_hpu.emulation.device_stream import DeviceStream


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


@pytest.fixture
def torch_threads():
    """Torch's thread count is process-wide state: restored after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"OMP_NUM_THREADS": "3"}, 3),  # the user's
        # vLLM's share of the cores for a worker: one left for the host thread.
        ({"OMP_NUM_THREADS": "3", "VLLM_OMP_NUM_THREADS_SET_BY_VLLM": "1"}, 2),
        ({"OMP_NUM_THREADS": "1", "VLLM_OMP_NUM_THREADS_SET_BY_VLLM": "1"}, 1),
    ],
)
def test_compute_threads_leave_the_host_a_core(
    variables, expected, hpu_env, monkeypatch
):
    from vllm_hpu import device

    # An engine started earlier in this process (e2e) leaves vLLM's marker set.
    monkeypatch.delenv("VLLM_OMP_NUM_THREADS_SET_BY_VLLM", raising=False)
    hpu_env(**variables)
    assert device.compute_threads() == expected


@pytest.mark.parametrize(
    ("policy", "beside_host", "expected"),
    [
        ("PASSIVE", False, 3),  # synchronous steps: the host thread waits
        ("passive", False, 3),
        ("PASSIVE", True, 2),  # async scheduling: the host thread runs beside
        ("", False, 2),  # busy-waiting threads: one core stays free
        ("ACTIVE", False, 2),
    ],
)
def test_synchronous_steps_take_every_core_when_openmp_sleeps(
    policy, beside_host, expected, hpu_env, monkeypatch
):
    from vllm_hpu import device

    hpu_env(
        OMP_NUM_THREADS="3",
        VLLM_OMP_NUM_THREADS_SET_BY_VLLM="1",
        OMP_WAIT_POLICY=policy,
    )
    assert device.compute_threads(beside_host=beside_host) == expected


def test_emulated_device_work_uses_the_same_threads_on_either_thread(
    hpu_env, torch_threads, monkeypatch
):
    """The host thread (async off) and the stream's thread (async on) compute
    with the same torch thread count: with torch's default, the host thread's
    OpenMP team alone busy-waited at full spin and ran several times slower
    (benchmarks/stream_threads.py)."""
    from vllm_hpu import device

    monkeypatch.delenv("VLLM_OMP_NUM_THREADS_SET_BY_VLLM", raising=False)
    hpu_env(OMP_NUM_THREADS="3")
    torch.set_num_threads(2)
    stream = device.device_stream(queued=True)
    assert torch.get_num_threads() == 3
    assert stream.submit(torch.get_num_threads).result() == 3
