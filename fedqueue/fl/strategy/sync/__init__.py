"""Synchronous FedAvg rounds: the strategy, the round machinery, read-ahead of a round's tail, aggregation
requests, and the repair pass over rounds."""
