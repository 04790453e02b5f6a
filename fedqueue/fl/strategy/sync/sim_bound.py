"""How many synchronous rounds fit in `max_sim_time`, known before the run starts.

A round ends, in simulated time, when its slowest selected device arrives (fedqueue.fl.strategy.sync.rounds
records it as the round's sim_time): both depend on the seed and the clock alone. FedRevive's simulator
takes events until one comes at or after `max_wait_time`; a round whose last update would come then is
never aggregated. So the run's last round is the last one that ends before the limit, and its length
(`rounds_total`) is known at submit.
"""

from __future__ import annotations

from fedqueue.errors import ConfigError
from fedqueue.fl.config import RunConfig
from fedqueue.fl.strategy.sync.rounds import select_devices


def rounds_within(config: RunConfig) -> int:
    """The rounds the run makes: `rounds`, or fewer where a round would end at or after max_sim_time."""
    if config.max_sim_time is None:
        return config.rounds
    # torch: the clock reads the devices' data sizes; called at submit, which loads them anyway
    from fedqueue.fl.strategy.trip_clock import run_clock

    clock = run_clock(config)
    ends = 0.0
    for round_index in range(1, config.rounds + 1):
        selected = select_devices(config.seed, round_index, config.num_devices, config.devices_per_round)
        # The same sum, in the same order, as the aggregator's: the same float.
        ends = ends + max((clock.trip_seconds(round_index, device) for device in selected), default=0.0)
        if ends >= config.max_sim_time:
            if round_index == 1:
                raise ConfigError(
                    f"max_sim_time: round 1 already ends at {ends:.1f} simulated seconds, past max_sim_time ="
                    f" {config.max_sim_time}"
                )
            return round_index - 1
    return config.rounds
