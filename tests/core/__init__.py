"""Tests of fedqueue.core: the broker's state, runs and their repair, a follower's waits, a process's own
concerns, the job-kind registry.
"""
