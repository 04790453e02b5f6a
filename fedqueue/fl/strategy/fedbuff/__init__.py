"""Buffered asynchronous FL (FedBuff): the strategy and its repair pass, the fold pass and the version rules it
takes (FedBuff's own, the plain buffered fold), the pure schedule on a virtual clock, staleness weights."""
