"""The API names module: the paths and arguments it builds are KAI's wire names."""

from kai_ray.api_names import PODGROUP, QUEUE


def test_paths_of_collections_and_objects() -> None:
    assert PODGROUP.path() == "/apis/scheduling.run.ai/v2alpha2/podgroups"
    assert PODGROUP.path("ns") == "/apis/scheduling.run.ai/v2alpha2/namespaces/ns/podgroups"
    assert PODGROUP.path("ns", "pg") == \
        "/apis/scheduling.run.ai/v2alpha2/namespaces/ns/podgroups/pg"
    assert QUEUE.path(name="team-a") == "/apis/scheduling.run.ai/v2/queues/team-a"


def test_names_the_client_and_the_crds_use() -> None:
    assert QUEUE.gvp == ("scheduling.run.ai", "v2", "queues")
    assert (QUEUE.api_version, QUEUE.kind) == ("scheduling.run.ai/v2", "Queue")
    assert PODGROUP.crd_name == "podgroups.scheduling.run.ai"
