"""Tests of buffered async FedBuff (fedqueue.fl.strategy.fedbuff): its schedule, staleness, config, runs."""
