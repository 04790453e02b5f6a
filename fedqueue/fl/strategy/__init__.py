"""Aggregation strategies behind one protocol (base.py), chosen per config (choose.py): synchronous rounds in
sync/, buffered async FedBuff and FedRevive in fedbuff/; what both share in common.py."""
