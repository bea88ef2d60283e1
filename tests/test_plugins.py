"""The plugin surface: third-party plugins load by entry point or object, built-ins the same way."""

import pytest
import torch
from click.testing import CliRunner

import specframe
from specframe import plugins
from specframe.cli import cli
from specframe.testing.models import tiny_model
from plugin_sources import POLICY_SOURCE, install_distribution


@pytest.fixture
def fresh_registry(monkeypatch):
    plugins.reset_registry()
    yield
    plugins.reset_registry()


def _install_throwaway_distribution(tmp_path, name="one-step"):
    """A minimal installed distribution (dist-info + module) exposing a `specframe` entry point."""
    install_distribution(tmp_path, name, "throwaway-dist", "0.3", "throwaway_plugin", "onestep")


def _generate_with(policy):
    target = tiny_model("llama", seed=0)
    dec = specframe.SpecDecoder.build(target=target, drafter=("model", {"model": target}), policy=policy)
    return dec.generate([5, 6, 7], max_new_tokens=6, eos_token_id=None)


def test_entry_point_plugin_is_listed_and_usable(tmp_path, monkeypatch, fresh_registry):
    _install_throwaway_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # the built-ins and this distribution, whatever else the environment holds (a plugin author's
    # own, the tutorial's): the last assertion below counts every registered name
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "specframe,throwaway-dist")
    result = CliRunner().invoke(cli, ["plugins"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "one-step" in result.output and "throwaway-dist" in result.output and "0.3" in result.output
    info = {p.name: p for p in specframe.get_registry().infos("policies")}["one-step"]
    assert (info.dist, info.version) == ("throwaway-dist", "0.3")
    out = _generate_with(("one-step", {"budget": 2}))
    assert len(out.tokens) == 6 and all(s.tree_size == 2 for s in out.steps)
    registry = specframe.get_registry()
    assert registry.names("policies", dist="Throwaway_Dist") == ["one-step"]  # PEP 503 names compare equal
    builtins = registry.names("policies", dist="specframe")
    assert "talon" in builtins and "one-step" not in builtins
    assert sorted(builtins + ["one-step"]) == registry.names("policies")


def test_plugin_object_registered_from_a_test(tmp_path, monkeypatch, fresh_registry):
    namespace: dict = {}
    exec(POLICY_SOURCE.format(name="object-step"), namespace)
    plugin = type("Plugin", (), {"register_tree_policies": staticmethod(namespace["register_tree_policies"])})
    specframe.register_plugin(plugin, dist="test-suite")
    assert "object-step" in specframe.available()["policies"]
    result = CliRunner().invoke(cli, ["plugins"], env={"COLUMNS": "200"})
    assert "object-step" in result.output and "test-suite" in result.output
    assert _generate_with("object-step").steps[0].tree_size == 2


def test_load_plugins_variable_restricts_distributions(tmp_path, monkeypatch, fresh_registry):
    _install_throwaway_distribution(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "throwaway-dist")
    found = specframe.available()
    # built-ins are only reachable through their entry points, so excluding the distribution
    # excludes them
    assert found == {"policies": ["one-step"], "drafters": [], "verifiers": []}
    monkeypatch.setenv("SPECFRAME_LOAD_PLUGINS", "specframe")
    plugins.reset_registry()
    assert "one-step" not in specframe.available()["policies"]
    assert "chain" in specframe.available()["policies"]


def test_duplicate_plugin_names_are_reported(fresh_registry):
    class Clash(specframe.TreePolicy):
        name = "chain"

        def build(self, session, budget):
            return session.new_tree()

    plugin = type("Plugin", (), {"register_tree_policies": staticmethod(
        specframe.hookimpl(lambda register: register(Clash)))})
    specframe.register_plugin(plugin, dist="clashing-dist")
    with pytest.raises(specframe.PluginError, match="'chain' registered twice.*specframe.*clashing-dist"):
        specframe.available()


def test_unknown_plugin_lists_available(fresh_registry):
    with pytest.raises(specframe.PluginError, match="unknown policy 'nope'; available policies: .*chain"):
        specframe.get_registry().get("policies", "nope")


def test_plugins_lists_the_batch_allocators() -> None:
    from specframe.decode.allocate import allocator_classes

    result = CliRunner().invoke(cli, ["plugins"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "batch allocators" in result.output
    for name in allocator_classes():
        assert name in result.output
