"""How many worker slots a job's batches will run on: those of the workers that answer on the broker now.

Two broadcasts go out at once, each on its own connection: every worker's pool size, and the queues it
reads. Only workers that read the LLM queue count (`fedqueue worker --jobs fl` takes no batches).
Answers come within milliseconds of each other, so collecting stops REPLY_GAP_S after the last one
instead of waiting a fixed second.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from fedqueue.config import Settings
from fedqueue.llm.messages import LLM_QUEUE

REPLY_GAP_S = 0.15


def answering_slots(settings: Settings) -> int | None:
    """Task slots of the workers serving LLM batches on the broker; None when none answers."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="fedqueue-slots") as pool:
        stats = pool.submit(_broadcast, settings, "stats")
        queues = pool.submit(_broadcast, settings, "active_queues")
        return llm_slots(stats.result(), queues.result(), settings.queue(LLM_QUEUE))


def answering_slots_later(settings: Settings) -> Future[int | None]:
    """`answering_slots` in a thread: the workers answer while the caller reads its input."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedqueue-slots")
    try:
        return pool.submit(answering_slots, settings)
    finally:
        pool.shutdown(wait=False)


def slots_answered(answering: Future[int | None], warn: Callable[[str], object]) -> int | None:
    """The slots `answering_slots_later` found; None (the default plan) when none answers or the broker would not
    carry the broadcast (a broker that answers the publisher but not a broadcast: plan by default)."""
    try:
        return answering.result()
    except Exception as error:
        warn(f"could not ask the workers for their slots ({error})")
        return None


def llm_slots(stats: list[dict[str, Any]], queues: list[dict[str, Any]], llm_queue: str) -> int | None:
    """Sum the pool sizes of the workers whose queues include `llm_queue`, from broadcast replies.

    A worker seen reading the queue whose pool size did not arrive counts as one slot.
    """
    pools = {name: _pool_size(info) for reply in stats for name, info in reply.items()}
    serving = {
        name
        for reply in queues
        for name, listed in reply.items()
        if any(isinstance(queue, dict) and queue.get("name") == llm_queue for queue in listed or [])
    }
    return sum(pools.get(name, 1) for name in serving) or None


def _pool_size(info: Any) -> int:
    try:
        return max(1, int(info["pool"]["max-concurrency"]))
    except (KeyError, TypeError, ValueError):
        return 1


def _broadcast(settings: Settings, command: str) -> list[dict[str, Any]]:
    from fedqueue.queue.app import make_app

    app = make_app(settings)
    try:
        # The timeout is the wait for each next answer, so this returns REPLY_GAP_S after the last.
        return list(app.control.broadcast(command, reply=True, timeout=REPLY_GAP_S) or [])
    finally:
        app.close()
