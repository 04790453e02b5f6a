"""A sync round starts the next one before its checkpoint commits, and stays claimed until it does.

An aggregator that dies in between leaves two open rounds: the one still closing and the one it started. The
repair pass takes the first over, the second's aggregation waits for it, and the run ends on the reference's
weights. Real SQLite store, the in-memory ledger and blob store, tasks run in this process in the order a queue
hands them out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedqueue.config import Settings
from fedqueue.fl.messages import AggregateTask
from fedqueue.fl.scheduler import reconcile
from fedqueue.fl.store.results import list_rounds, load_checkpoint, unclaim_round
from fedqueue.fl.strategy.common import checkpoint_version, final_state
from fedqueue.fl.strategy.registry import strategy_for
from fedqueue.fl.strategy.sync import rounds
from fedqueue.fl.strategy.sync.repair import repair_rounds
from tests.support.helpers import assert_same_weights, reference_final_state, small_config
from tests.support.in_process_run import in_process_run
from tests.support.reliability_support import wait_until

SETTINGS = Settings(key_prefix="closing", heartbeat_ttl_s=1, max_attempts=3, max_lost_attempts=3)


class _Killed(BaseException):
    """The aggregating process dying where the checkpoint would commit."""


def test_an_aggregator_killed_before_its_checkpoint_leaves_the_next_round_running_and_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = small_config(rounds=3, num_devices=12, devices_per_round=4, local_iters=2)
    with in_process_run(tmp_path, SETTINGS, config) as run:

        def killed_once(*args: object, **kwargs: object) -> None:
            monkeypatch.setattr(rounds, "checkpoint_version", checkpoint_version)
            monkeypatch.setattr(rounds, "unclaim_round", lambda *_: None)  # a dead process hands nothing back
            raise _Killed()

        monkeypatch.setattr(rounds, "checkpoint_version", killed_once)
        outcomes: dict[int, list[float | None]] = {}

        def aggregate(message: AggregateTask) -> None:
            index = message.round_index
            try:
                outcome = rounds.aggregate_round(run.services, run.run_id, index, f"here#{len(outcomes)}", run.cache)
            except _Killed:
                monkeypatch.setattr(rounds, "unclaim_round", unclaim_round)
                states = [(row.round_index, row.state) for row in list_rounds(run.store, run.run_id)]
                assert states == [(1, "aggregating"), (2, "training")]
                found = load_checkpoint(run.store, run.run_id)
                assert found is not None and found.version == 0
                outcome = None
            outcomes.setdefault(index, []).append(outcome)

        def taken_over() -> None:
            # Nothing queued: the round still closing is taken over once its claim is no longer renewed.
            wait_until(lambda: any("taken over" in action for action in reconcile(run.services, run.run_id)), 30)

        run.drive(aggregate, idle=taken_over)
        assert run.store.get_run(run.run_id).state == "finished"
        # Round 1: killed, then taken over. Round 2: its first aggregation found round 1 still open and gave the
        # slot back; it was asked for again (by the repair pass, by the takeover's close) and done once.
        assert [outcome is None for outcome in outcomes[1]] == [True, False]
        assert outcomes[2][0] is None and sum(outcome is not None for outcome in outcomes[2]) == 1
        assert [row.state for row in list_rounds(run.store, run.run_id)] == ["done"] * 3
        assert_same_weights(final_state(run.store, run.run_id), reference_final_state(config))


def test_a_next_round_model_lost_while_its_round_closes_is_published_again_by_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that restarts empty while round 1's checkpoint commits takes round 2's model with it; the repair
    pass cannot republish it from a checkpoint not yet in, so it waits, and round 1's close publishes it."""
    config = small_config(rounds=2, num_devices=12, devices_per_round=4, local_iters=2)
    with in_process_run(tmp_path, SETTINGS, config) as run:
        repaired: list[str] = []

        def broker_restarts_first(*args: object, **kwargs: object) -> None:
            monkeypatch.setattr(rounds, "checkpoint_version", checkpoint_version)
            following = list_rounds(run.store, run.run_id)[-1]
            assert following.round_index == 2
            run.services.blobs.delete([following.model_key])
            repaired.extend(repair_rounds(run.services, run.run_id, config, True, strategy_for(config)))
            checkpoint_version(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(rounds, "checkpoint_version", broker_restarts_first)
        run.drive(
            lambda message: rounds.aggregate_round(run.services, run.run_id, message.round_index, "here#1", run.cache)
        )
        assert repaired == ["round 2: global model 1 waits on its round's close"]
        assert run.store.get_run(run.run_id).state == "finished"
        assert_same_weights(final_state(run.store, run.run_id), reference_final_state(config))
