"""The test double's own machinery, no part of the published bridge: its
configuration, the emulated device (csrc/hpu_device.cpp), card acquisition,
HPU-graph recording and the ways Habana's torch differs from stock torch."""
