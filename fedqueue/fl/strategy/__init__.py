"""Aggregation strategies behind one protocol (base.py), looked up by the config's mode (registry.py; what callers
outside may know of a mode in mode.py): synchronous rounds in sync/, buffered async FedBuff and FedRevive in
fedbuff/; what both share in common.py."""
