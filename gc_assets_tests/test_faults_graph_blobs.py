"""test_faults_graph's tests on Azurite and fake-gcs-server (S3's run in that file): the same
faults, checks and reruns, in a file of their own so that the two run side by side."""

from __future__ import annotations

import pytest

from gc_assets_tests import test_faults_graph as on_s3
from gc_assets_tests.blob_servers import azurite, fake_gcs  # noqa: F401 - the fixtures
from gc_assets_tests.test_faults_graph import Cloud, cloud_of, fast_timeouts  # noqa: F401 - the fixture

# Collected here, in test_faults_graph's order, against this file's clouds.
test_a_stalled_lease_listing_is_retried_within_the_timeout = (
    on_s3.test_a_stalled_lease_listing_is_retried_within_the_timeout
)
test_a_lease_record_written_with_its_answer_lost_is_ours = (
    on_s3.test_a_lease_record_written_with_its_answer_lost_is_ours
)
test_whole_graph_under_faults_finishes_exactly_or_fails_and_reruns_exactly = (
    on_s3.test_whole_graph_under_faults_finishes_exactly_or_fails_and_reruns_exactly
)


@pytest.fixture(params=["azurite", "fake_gcs"], scope="module")
def cloud(request) -> Cloud:
    return cloud_of(request)
