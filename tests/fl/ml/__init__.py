"""Tests of FL's machine-learning code (fedqueue.fl.ml): data, models, training, aggregation, synthesis."""
