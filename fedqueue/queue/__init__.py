"""Everything that touches Celery lives in this package."""
