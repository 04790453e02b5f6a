"""What every job kind shares, in rooms of one concept each.

Here at the top: the job-kind registry (jobs.py); the connections a process holds and how it opens them
(services.py, connect.py, database.py); what every kind's messages share and how they are signed (codec.py,
signing.py); a task's timing row (timing.py); which errors are the infrastructure's (infra_errors.py).

broker/   what fedqueue keeps in Redis besides Celery's messages: keys, the task ledger, blobs, dead letters
runs/     a run after it is submitted: supervision under a lease, adoption, lost tasks, retry, cancel
waits/    a follower through outages, a full broker and unread queues; what a run waits for
process/  a process's own concerns: GPUs, device sampling, a folder to write into, a fast exit

The cluster file of `fedqueue up` and the workers' time-limit watchdog live with Celery (fedqueue.queue).
Nothing here imports a job kind (`fedqueue.fl`, `fedqueue.llm`): kinds register themselves.
"""
