"""The network interface gloo uses on this node: the one holding VLLM_HOST_IP.
Without ``GLOO_SOCKET_IFNAME`` gloo binds to the host name's address (or
loopback), which other nodes may not reach: the process group never forms."""

import psutil
from vllm import envs as vllm_envs
from vllm.logger import init_logger

from vllm_hpu.envs import set_default

logger = init_logger("vllm.hpu.host_network")


def interface_with_address(address: str) -> str | None:
    """This node's interface holding ``address``; None if none does."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(entry.address == address for entry in addresses):
            return name
    return None


def choose_gloo_interface(host_ip: str = "") -> str | None:
    """Unless the user chose one, give gloo the interface of ``host_ip`` (by
    default VLLM_HOST_IP); returns the interface in force (None: gloo picks)."""
    host_ip = host_ip or vllm_envs.VLLM_HOST_IP
    if not host_ip:
        return None
    interface = interface_with_address(host_ip)
    if interface is None:
        logger.warning(
            "VLLM_HOST_IP=%s is not an address of this node's interfaces; gloo "
            "picks its own interface (set GLOO_SOCKET_IFNAME to choose one).",
            host_ip,
        )
        return None
    chosen = set_default("GLOO_SOCKET_IFNAME", interface)
    logger.info("gloo connects through %s (GLOO_SOCKET_IFNAME)", chosen)
    return chosen
