"""FedRevive: FedBuff's fold whose version rule mixes each update with one distilled from recent local models
(rule.py; the distillation's inputs in revive.py, its math in fedqueue.fl.ml.distill); its config section in
section.py."""
