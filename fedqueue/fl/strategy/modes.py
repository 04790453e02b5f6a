"""Every mode a run config may name, each with what callers may ask of it (mode.py); registry.py adds the
strategy and control tasks that run it."""

from fedqueue.fl.strategy.fedasync.mode import FEDASYNC
from fedqueue.fl.strategy.fedbuff.mode import FEDBUFF
from fedqueue.fl.strategy.fedrevive.mode import FEDREVIVE
from fedqueue.fl.strategy.mode import Mode
from fedqueue.fl.strategy.sync.mode import FEDAVG

MODES: dict[str, Mode] = {mode.name: mode for mode in (FEDAVG, FEDBUFF, FEDREVIVE, FEDASYNC)}
