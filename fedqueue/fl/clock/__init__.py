"""Simulated time and when a run ends: nothing here is measured, every figure comes from the config and its seed.

trips.py   the per-sample clock: speed classes, a trip's training and its delays
delays.py  FedRevive's per-phase delay tables, parsed and checked
phases.py  the two other clocks: FedRevive's per-phase draws and FLARE's per-trip tiers
stops.py   why a run ends: its bound on versions, simulated time, FedRevive's accuracy rules
section.py the run config's clock keys (clock, device_speed, the phase tables) and their checks
"""
