"""`max_concurrency` against brute-force counting, and `mask_url` hiding passwords."""

from __future__ import annotations

import itertools
import random
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedqueue.config import mask_url
from fedqueue.report.summary import max_concurrency

Interval = tuple[float, float]


def overlap_at(intervals: list[Interval], instant: float) -> int:
    """How many intervals hold `instant` strictly inside them."""
    return sum(1 for start, finish in intervals if start < instant < finish)


def brute_force_sampled(intervals: list[Interval], step: float = 1 / 64) -> int:
    """The most intervals seen at once over a fine grid of instants that never falls on an endpoint."""
    if not intervals:
        return 0
    low = min(start for start, _ in intervals)
    high = max(finish for _, finish in intervals)
    count = int((high - low) / step) + 1
    return max(overlap_at(intervals, low + step / 2 + i * step) for i in range(count))


def brute_force_midpoints(intervals: list[Interval]) -> int:
    """The most intervals seen at once, checking the midpoint between every pair of adjacent endpoints."""
    points = sorted({t for interval in intervals for t in interval})
    return max((overlap_at(intervals, (a + b) / 2) for a, b in itertools.pairwise(points)), default=0)


def test_empty_is_zero() -> None:
    """No intervals: nothing runs."""
    assert max_concurrency([]) == 0
    assert max_concurrency(iter(())) == 0


def test_disjoint_intervals_are_one() -> None:
    """Intervals with gaps between them never overlap."""
    intervals = [(0.0, 1.0), (2.0, 3.0), (5.5, 9.0)]
    assert brute_force_sampled(intervals) == 1
    assert max_concurrency(intervals) == 1


def test_touching_intervals_do_not_overlap() -> None:
    """One task finishing exactly when the next starts is one at a time, in either input order."""
    assert max_concurrency([(0.0, 1.0), (1.0, 2.0)]) == 1
    assert max_concurrency([(1.0, 2.0), (0.0, 1.0)]) == 1
    assert max_concurrency([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]) == 1


@pytest.mark.parametrize(
    "intervals",
    [
        [(0.0, 10.0), (1.0, 9.0), (2.0, 8.0), (3.0, 7.0)],  # nested
        [(0.0, 3.0), (2.0, 5.0), (4.0, 7.0), (6.0, 9.0)],  # a chain of pairwise overlaps
        [(0.0, 5.0), (1.0, 2.0), (3.0, 4.0), (4.0, 4.75)],  # nested, touching inside
        [(0.0, 4.0), (0.0, 4.0), (0.0, 4.0), (1.0, 2.0)],  # identical intervals
        [(0.0, 2.0), (1.0, 3.0), (1.5, 2.5), (2.0, 2.25), (2.75, 4.0), (3.5, 5.0)],
    ],
)
def test_overlapping_sets_match_sampled_brute_force(intervals: list[Interval]) -> None:
    """Nested and overlapping sets: the sweep equals the count seen at sampled instants, for any order."""
    expected = brute_force_sampled(intervals)
    assert expected >= 2  # these sets do overlap
    shuffled = intervals[:]
    random.Random(len(intervals)).shuffle(shuffled)
    assert max_concurrency(intervals) == expected
    assert max_concurrency(shuffled) == expected
    assert max_concurrency(reversed(intervals)) == expected


# Endpoints on a grid of quarters: exact in binary, so midpoints are exact too.
endpoints = st.integers(min_value=0, max_value=80).map(lambda k: k / 4)
intervals_strategy = st.lists(st.tuples(endpoints, endpoints).map(lambda pair: (min(pair), max(pair))), max_size=25)


@settings(max_examples=300, deadline=None)
@given(intervals_strategy)
def test_matches_brute_force_over_endpoint_midpoints(intervals: list[Interval]) -> None:
    """For any set of intervals (zero-length ones and duplicates included) the sweep equals the brute force."""
    assert max_concurrency(intervals) == brute_force_midpoints(intervals)


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("redis://:pw@h:6379/0", "pw"),
        ("postgresql://u:pw@h/db", "pw"),
        ("postgresql+psycopg://user:s3cret@db.example:5433/fed?sslmode=require", "s3cret"),
    ],
)
def test_mask_url_hides_the_password(url: str, password: str) -> None:
    """The password is gone; scheme, user, host, port, path and query stay."""
    masked = mask_url(url)
    assert password not in masked
    before, after = urlsplit(url), urlsplit(masked)
    assert after.password == "***"
    assert (after.scheme, after.username, after.hostname, after.port, after.path, after.query) == (
        before.scheme,
        before.username,
        before.hostname,
        before.port,
        before.path,
        before.query,
    )


@pytest.mark.parametrize(
    "url",
    ["redis://h:6379/0", "redis://127.0.0.1:6379/2", "postgresql://u@h/db", "sqlite:///tmp/fedqueue.db", "sqlite://"],
)
def test_mask_url_leaves_urls_without_password(url: str) -> None:
    """A URL with no password comes back unchanged."""
    assert mask_url(url) == url


def test_mask_url_of_nothing() -> None:
    """No URL at all prints as a placeholder."""
    assert mask_url(None) == mask_url("") == "<none>"


def test_mask_url_keeps_ipv6_brackets_and_hides_query_passwords() -> None:
    assert mask_url("postgresql://u:pw@[::1]:5432/db") == "postgresql://u:***@[::1]:5432/db"
    masked = mask_url("postgresql://u@h/db?password=pw&sslmode=require")
    assert "pw" not in masked.replace("password", "") and "sslmode=require" in masked
