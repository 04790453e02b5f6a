"""Aggregation strategies behind one protocol (base.py), looked up by the config's mode (registry.py; what callers
outside may know of a mode in mode.py): synchronous rounds in sync/, buffered async FedBuff in fedbuff/ (its fold
takes a version rule, rule.py), FedRevive's rule in fedrevive/; what all share in common.py."""
