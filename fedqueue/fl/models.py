"""Kept for user configs and plugins written against the earlier path: `fedqueue.fl.models` is `fedqueue.fl.ml.models`.

The same module object, so every name (and a test's monkeypatch) reaches the one in fedqueue.fl.ml.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("fedqueue.fl.ml.models")
