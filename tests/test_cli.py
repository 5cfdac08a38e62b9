import pytest

from kai_ray.cli import _HANDLERS, build_parser


def test_every_command_has_a_handler():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        handler = p.get_default("handler")
        if name == "bench":
            continue
        assert handler in _HANDLERS, name


def test_unknown_command_is_rejected(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["frobnicate"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_dev_cluster_install_needs_the_real_node(capsys, tmp_path, monkeypatch):
    from kai_ray.testing.devcluster import cmd_dev_cluster

    monkeypatch.setenv("KAI_RAY_DEV_CLUSTER_DIR", str(tmp_path / "dc"))
    args = build_parser().parse_args(["dev-cluster", "up", "--install"])
    assert cmd_dev_cluster(args) == 2
    assert "--install needs --real-node" in capsys.readouterr().err
    assert not (tmp_path / "dc").exists()  # nothing was started


@pytest.mark.parametrize("command", [["run"], ["webhook"]])
def test_log_level_is_checked(command, capsys):
    assert build_parser().parse_args([*command, "--log-level", "debug"]).log_level == "debug"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--log-level", "loud"])
    assert "invalid choice: 'loud'" in capsys.readouterr().err
