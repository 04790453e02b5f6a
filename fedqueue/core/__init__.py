"""What every job kind shares: the job-kind registry, blobs, message codec, heartbeats, services, local clusters.

Nothing here imports a job kind (`fedqueue.fl`, `fedqueue.llm`): kinds register themselves.
"""
