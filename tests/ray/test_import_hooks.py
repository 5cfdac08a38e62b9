"""The import hooks the helper arms in Ray workers (a throwaway module, no framework)."""

import sys

from kai_ray.ray import import_hooks


def test_before_runs_ahead_of_the_module_and_after_once_it_ran(tmp_path, monkeypatch):
    (tmp_path / "kai_probe_mod.py").write_text(
        "import os\nSEEN = os.environ.get('KAI_PROBE_VAR')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kai_probe_mod", raising=False)
    calls = []

    def before(name):
        calls.append(("before", name))
        monkeypatch.setenv("KAI_PROBE_VAR", "set-before")

    def after(module):
        calls.append(("after", module.SEEN))

    import_hooks.on_import("kai_probe_mod", before=before, after=after)
    assert import_hooks.is_installed("kai_probe_mod")
    assert calls == []  # looking a module up is not importing it
    import kai_probe_mod

    assert kai_probe_mod.SEEN == "set-before"
    assert calls == [("before", "kai_probe_mod"), ("after", "set-before")]
    # the module looks normally imported
    assert type(kai_probe_mod.__loader__).__name__ != "_CallbackLoader"
    assert type(kai_probe_mod.__spec__.loader).__name__ != "_CallbackLoader"
    assert not import_hooks.is_installed("kai_probe_no_such_module")
