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


def _wire_names() -> dict[str, str]:
    """api_names' string constants that are names on the wire (labels, annotations, groups)."""
    import kai_ray.api_names as names

    return {value: key for key, value in vars(names).items()
            if key.isupper() and isinstance(value, str)
            and ("/" in value or value in ("pod-group-name", "scheduling.run.ai"))}


def test_no_wire_name_is_spelt_outside_the_module() -> None:
    """A label, annotation or API group is written once, in kai_ray/api_names.py: a code
    string equal to one elsewhere in kai_ray is a copy that could drift (docstrings and
    messages mention them freely: only whole string constants count)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "kai_ray"
    names = _wire_names()
    assert "pod-group-name" in names and "kai.scheduler/queue" in names
    copies = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "api_names.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                    | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value in names and id(node) not in docstrings:
                copies.append(f"{path.relative_to(root.parent)}:{node.lineno}: "
                              f"{node.value!r} (api_names.{names[node.value]})")
    assert not copies, "\n".join(copies)
