"""What a follower does and says while its run cannot go on: it waits through a broker outage (outage.py)
or a store outage (store_watch.py), says when the broker is full (room.py) or when no worker reads a
queue its tasks wait on (unread.py); and what a run waits for, as `fedqueue status` shows it (waiting.py).
"""
