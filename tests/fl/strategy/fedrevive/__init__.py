"""Tests of FedRevive (fedqueue.fl.strategy.fedrevive): its distillation and its runs on the queue."""
