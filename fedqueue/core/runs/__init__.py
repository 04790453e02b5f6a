"""A run's life after it is submitted, for every kind: the one process that schedules it under a lease and
repairs it (supervisor.py), launchers adopting runs nobody schedules (adopt.py), which tasks are lost
(lost.py), a failed run tried again (retry.py), a run cancelled for good (cancel.py).
"""
