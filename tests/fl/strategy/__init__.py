"""Tests of FL's strategies (fedqueue.fl.strategy): the registry, and one folder per strategy."""
