import pytest

from pipeline.registry import Registry, load_object


def test_module_attr_targets_load_directly():
    assert load_object("pipeline.registry:Registry") is Registry
    assert Registry("x", {}).get("pipeline.registry:load_object") is load_object


def test_unknown_names_list_the_known_ones():
    registry = Registry("widgets", {"a": "pipeline.registry:Registry"})
    with pytest.raises(LookupError, match="unknown widgets 'b' \\(known: a"):
        registry.get("b")
    assert registry.check("b", "widget.name") and registry.check("a", "widget.name") == []


def test_bad_targets_say_what_is_wrong():
    with pytest.raises(LookupError, match="not of the form"):
        load_object("nocolon")
    with pytest.raises(LookupError, match="cannot import module"):
        load_object("no_such_module_xyz:thing")
    with pytest.raises(LookupError, match="has no attribute"):
        load_object("pipeline.registry:Nope")


def test_duplicate_names_are_refused():
    registry = Registry("widgets", {"a": "m:A"})
    registry.register("a", "m:A")  # same target: fine
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a", "m:B")


def test_builtins_are_also_installed_entry_points():
    """The built-in gate is reachable through the same entry-point group a plugin would use."""
    import importlib.metadata

    names = {ep.name for ep in importlib.metadata.entry_points(group="rollcut.gates")}
    assert "prefix_edit_distance" in names
    fresh = Registry("gates", {})  # no built-in table: only entry points
    assert fresh.get("prefix_edit_distance").__name__ == "PrefixEditDistanceGate"


def test_a_dotted_path_is_told_to_write_module_colon_attr():
    registry = Registry("gates", {"a": "pipeline.registry:Registry"})
    with pytest.raises(LookupError, match="written module:attr, e.g. 'mypkg.gates:MyGate'"):
        registry.get("mypkg.gates.MyGate")
    with pytest.raises(LookupError) as plain:
        registry.get("b")
    assert "module:attr" not in str(plain.value)  # a plain unknown name gets no hint
    with pytest.raises(LookupError, match="PYTHONPATH"):
        load_object("no_such_module_xyz:thing")
