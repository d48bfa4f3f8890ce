"""KV cache that leaves the device: vLLM's KV connectors on the HPU plugin.

- ``layout``: the block-major views of our flat caches that connectors address.
- ``config``: which connectors run here; refused ones fail at start-up.
- ``offloading``: ``--kv-offloading-size`` through the plugin's offloading spec.
- ``blocks``: block copies between device caches and host buffers.
The worker's and runner's side of the connector contract is a capability of the
worker: ``worker/capabilities/kv_connector.py``.
"""
