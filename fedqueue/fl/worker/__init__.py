"""What a worker process does for FL: the device task, its timing rows, the models it keeps between tasks."""
