"""A finished run's stop in the store: the rule that ended it, written once, read by status and the report."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, update

from fedqueue.fl.clock.stops import Stop
from fedqueue.fl.store.schema import RoundRow, StopRow
from fedqueue.store.repo import Store, dialect_insert, retry_transient

STOPS = cast(Table, StopRow.__table__)
ROUNDS = cast(Table, RoundRow.__table__)


@retry_transient
def record_stop(store: Store, run_id: str, stop: Stop, metrics: dict[str, Any] | None = None) -> None:
    """Record why the run ended, unless a stop is recorded already (a replayed pass finds the same one).

    `metrics`: the last version's evaluation, made once the stop was known (its round is updated with it).
    """
    with store.engine.begin() as connection:
        connection.execute(
            dialect_insert(connection.dialect)(STOPS)
            .values(run_id=run_id, **stop.to_dict())
            .on_conflict_do_nothing(index_elements=["run_id"])
        )
        if metrics:
            connection.execute(
                update(ROUNDS).where(ROUNDS.c.run_id == run_id, ROUNDS.c.round_index == stop.version).values(**metrics)
            )


@retry_transient
def get_stop(store: Store, run_id: str) -> Stop | None:
    with store.session() as session:
        row = session.get(StopRow, run_id)
        if row is None:
            return None
        return Stop(row.rule, row.reason, row.version, row.sim_time)
