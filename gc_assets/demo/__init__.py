"""The demo: an embedded lake collected end to end (`gc-assets demo`), and the synthetic lakes
the demo, the tests and the benchmarks are built from (lakegen)."""
