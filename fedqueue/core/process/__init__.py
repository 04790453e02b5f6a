"""A process's own concerns, whatever it runs: which GPUs it sees (gpus.py), its device sampled while it
works (utilization.py), a folder it writes into tried first (writable.py), a fast exit (fast_exit.py).
"""
