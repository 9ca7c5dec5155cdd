"""Questions an operator asks of a partition, answered without touching storage:
why one object is kept or collected (explain), and what other rules would reclaim (whatif)."""
