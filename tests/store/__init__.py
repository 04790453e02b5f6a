"""Tests of fedqueue.store: the SQL store on SQLite and Postgres, and its migrations."""
