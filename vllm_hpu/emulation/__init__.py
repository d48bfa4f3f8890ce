"""The CPU side of ``device.py``: what emulation runs where Gaudi has hardware (a
metered device memory, the device stream's worker thread, linears packed for the
CPU's matrix instructions)."""
