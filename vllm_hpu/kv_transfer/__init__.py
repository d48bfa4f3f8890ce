"""KV cache that leaves the device: vLLM's KV connectors on the HPU plugin
(``layout``, ``config``, ``offloading``, ``blocks``); the worker's side of the
contract is ``worker/capabilities/kv_connector.py``."""
