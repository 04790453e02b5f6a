"""Tests of FL's simulated time (fedqueue.fl.clock)."""
