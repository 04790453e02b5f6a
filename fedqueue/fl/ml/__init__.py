"""FL's machine-learning code, torch and numbers only: data, models, local and packed training, aggregation,
evaluation, weights as bytes, seeds, distillation. Nothing here imports the core, the store, the broker or
FL's scheduling, so it tests without a worker."""
