"""Example fedqueue plugins: a FedProx local step, a dataset with natural per-writer splits, a GroupNorm CNN."""
