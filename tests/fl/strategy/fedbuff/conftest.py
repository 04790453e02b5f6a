"""The FedBuff tests' services: a submitter's, with no workers asked for their slots."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fedqueue.config import Settings
from fedqueue.core.services import Services
from fedqueue.queue.client import open_client_services


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    opened = open_client_services(settings, worker_slots=lambda: {})
    yield opened
    opened.close()
