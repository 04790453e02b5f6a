"""FedAsync behind the strategy seam: FedBuff's fold pass, repair and control task, with FedAsync's version rule."""

from fedqueue.fl.strategy.fedasync.rule import MIX
from fedqueue.fl.strategy.fedbuff.strategy import buffered_entry

ENTRY = buffered_entry(MIX)
