"""The simulator commands, end to end through the CLI entry point."""

import json
from pathlib import Path

from kai_ray.cli import main

SCENARIOS = Path(__file__).parent / "scenarios"


def test_demo_runs_every_sample_and_reports(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 scenarios behaved as expected" in out
    # the gang that does not fit is explained with the node-fit histogram
    assert "Resources were found for 4 pods while 5 are required" in out
    assert "shared device" in out


def test_conformance_exit_code_and_summary(tmp_path, capsys):
    assert main(["conformance", str(SCENARIOS / "seeds.yaml")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "6 passed, 0 failed"
    bad = tmp_path / "bad.yaml"
    bad.write_text((SCENARIOS / "seeds.yaml").read_text().replace(
        "build-pod: {status: Running, node: node0}", "build-pod: {status: Pending}"))
    assert main(["conformance", str(bad)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "5 passed, 1 failed"


def test_unsupported_field_fails_loudly(tmp_path, capsys):
    f = tmp_path / "x.yaml"
    f.write_text("scenarios:\n- id: X\n  run: allocate\n"
                 "  nodes: [{name: n, gpus: 1, colour: red}]\n")
    assert main(["conformance", str(f)]) == 1
    out = capsys.readouterr().out
    assert "nodes.0.colour" in out and "0 passed, 1 failed" in out


def test_simulate_json_and_timing(capsys):
    assert main(["simulate", str(SCENARIOS / "seeds.yaml"), "-o", "json", "--timing"]) == 0
    out = capsys.readouterr().out
    body, timing = out.rsplit("\n", 2)[0], out.strip().splitlines()[-1]
    docs = json.loads(body)
    assert [d["id"] for d in docs][:2] == ["SEED-01", "SEED-02"]
    assert docs[0]["binds"][0]["pod"] == "vllm-test-02-0"
    assert timing.startswith("schedule: ") and timing.endswith(" s")
