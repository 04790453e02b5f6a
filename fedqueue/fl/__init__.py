"""The federated-learning job kind: synchronous FedAvg rounds and buffered async FedBuff/FedRevive on workers.

kind.py is what the core sees (tasks, repair pass, commands); messages.py, config.py, api.py and cli.py
are the kind's messages, run config, Python API and commands; setup.py turns a config into what the
torch code takes; scheduler.py submits and repairs runs.

    clock/        simulated time: trip times, delay tables, the clocks, stop rules
    config_files/ reading a config file: fedqueue's TOML, or FedRevive's JSON as it is
    ml/           torch code only: data, models, training, aggregation, evaluation (no core, no broker)
    packs/        several devices per task: the `auto` rules, the trial at submit, tasks cut from a selection
    worker/       the device task a worker runs, its timing rows, what a worker keeps between tasks
    strategy/     the strategy protocol and what all share; sync/ rounds, fedbuff/ FedBuff, fedrevive/ FedRevive
    store/        the kind's tables, rows and migrations
    view/         status, report, pictures and progress bars of a run

models.py, aggregate.py, data.py and plugins.py keep the paths plugins were written against.
"""
