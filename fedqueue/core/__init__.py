"""What every job kind shares: the job-kind registry, blobs, the task ledger, message codec, heartbeats, services.

Nothing here imports a job kind (`fedqueue.fl`, `fedqueue.llm`): kinds register themselves.
"""
