"""Tests of fedqueue.report: status, reports and their numbers, each kind's hooks."""
