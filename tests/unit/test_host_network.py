"""gloo's interface on a node: the one holding VLLM_HOST_IP, unless the user
named one (tests/e2e/test_multinode.py needs it: two nodes, each in its own
network namespace, where gloo's own choice is the loopback address)."""

import os

import pytest

from vllm_hpu.distributed.host_network import (
    choose_gloo_interface,
    interface_with_address,
)

NOT_HERE = "192.0.2.1"  # TEST-NET-1: documentation only, on no interface


@pytest.fixture
def no_gloo_interface(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)


def test_interface_with_address():
    assert interface_with_address("127.0.0.1") == "lo"
    assert interface_with_address(NOT_HERE) is None


def test_host_ip_names_gloo_interface(no_gloo_interface):
    assert choose_gloo_interface("127.0.0.1") == "lo"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"


def test_user_interface_kept(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    assert choose_gloo_interface("127.0.0.1") == "eth7"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"


@pytest.mark.parametrize("host_ip", ["", NOT_HERE])
def test_no_host_ip_of_this_node_leaves_gloo_alone(
    host_ip, no_gloo_interface, monkeypatch
):
    monkeypatch.setenv("VLLM_HOST_IP", host_ip)
    assert choose_gloo_interface(host_ip) is None
    assert "GLOO_SOCKET_IFNAME" not in os.environ
