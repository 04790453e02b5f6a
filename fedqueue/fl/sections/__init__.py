"""The run config's sections: each a frozen dataclass of flat keys, checked beside what it configures.

base.py says what a section is and how its keys are read. The sections every run has live beside their owners
(the data's in fl/ml/data_section.py, local training's in fl/ml/train_section.py, packing's in fl/packs/section.py,
the clock's in fl/clock/section.py); the strategies' in their own folders (fl/strategy/<name>/section.py), named
by their `Mode`.
"""
