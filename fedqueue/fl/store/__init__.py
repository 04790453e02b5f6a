"""The FL kind's tables, their rows and queries (rounds, device results, checkpoints, schedules), and the
kind's migrations (store/migrations/, a schema branch of its own)."""
