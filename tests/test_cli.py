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
