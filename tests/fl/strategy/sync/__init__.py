"""Tests of synchronous rounds (fedqueue.fl.strategy.sync)."""
