"""FedAsync (Xie, Koyejo and Gupta, 2019): every arriving update mixed into the current version at once.

FedBuff's fold with a buffer of one and FedAsync's version rule (rule.py), on the same virtual clock and
schedule; its config section (FedBuff's, with its own keys) in section.py.
"""
