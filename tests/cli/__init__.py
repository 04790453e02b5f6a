"""Tests of the `fedqueue` command as a user meets it: runs, cancels, local clusters, start-up, errors."""
