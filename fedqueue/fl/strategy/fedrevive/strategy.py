"""FedRevive behind the strategy seam: FedBuff's fold pass, repair and control task, with FedRevive's version rule."""

from fedqueue.fl.strategy.fedbuff.strategy import buffered_entry
from fedqueue.fl.strategy.fedrevive.rule import REVIVE

ENTRY = buffered_entry(REVIVE)
