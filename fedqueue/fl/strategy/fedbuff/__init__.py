"""Buffered asynchronous FL (FedBuff) and FedRevive: the strategy and its repair pass, the fold pass, the pure
schedule on a virtual clock, staleness weights, FedRevive's mixing in the fold."""
