"""Tests of FedAsync (fedqueue.fl.strategy.fedasync): its rule, its runs, the views of its runs."""
