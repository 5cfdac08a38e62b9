"""The everyday command-line tools (`kai-ray queues`, `kai-ray explain`, `kai-ray snapshot`):
each reads the live cluster once through the scheduler's own cache and runs the real core on it."""
