"""Plugin manager: built-ins and third parties both load through the ``specframe`` entry points.

``SPECFRAME_LOAD_PLUGINS`` (comma-separated distribution names) restricts which distributions'
plugins load, so an A/B run can pin exactly the code it compares. Unset or empty means all.

One broken distribution never takes the others down: an entry point that fails to import, or a
hook that raises, is skipped with a one-line :class:`PluginWarning` naming the distribution and
the error (see :func:`specframe.errors.warn`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Iterable

import pluggy

from specframe import hookspecs
from specframe.errors import PluginWarning, one_line, warn

hookimpl = pluggy.HookimplMarker("specframe")
ENTRY_POINT_GROUP = "specframe"
KINDS = ("policies", "drafters", "verifiers")
SINGULAR = {"policies": "policy", "drafters": "drafter", "verifiers": "verifier"}
_HOOK_OF_KIND = {
    "policies": "register_tree_policies",
    "drafters": "register_drafters",
    "verifiers": "register_verifiers",
}


LOAD_VARIABLE = "SPECFRAME_LOAD_PLUGINS"


class PluginError(LookupError):
    """Unknown plugin name or conflicting registrations; the message lists what is available."""


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin class and where it came from."""

    kind: str
    name: str
    cls: type
    dist: str
    version: str


def normalise_dist(name: str) -> str:
    """A distribution name in PEP 503 normal form (``My_Dist`` and ``my-dist`` compare equal)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed_distributions() -> set[str] | None:
    """Distribution names allowed by ``SPECFRAME_LOAD_PLUGINS``, or None for all."""
    raw = os.environ.get(LOAD_VARIABLE, "").strip()
    if not raw:
        return None
    return {normalise_dist(part.strip()) for part in raw.split(",") if part.strip()}


class Registry:
    """Registered policies, drafters and verifiers, gathered through pluggy hooks."""

    def __init__(self, load_entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager("specframe")
        self.pm.add_hookspecs(hookspecs)
        self._origin: dict[int, tuple[str, str]] = {}
        self._plugins: dict[str, dict[str, PluginInfo]] | None = None
        #: ``(distribution, reason)`` of every plugin skipped because it failed.
        self.skipped: list[tuple[str, str]] = []
        #: names in SPECFRAME_LOAD_PLUGINS that match no installed distribution.
        self.unknown_allowed: list[str] = []
        if load_entry_points:
            self.load_entry_points()

    def load_entry_points(self) -> None:
        """Import and register every ``specframe`` entry point of the allowed distributions."""
        allowed = allowed_distributions()
        seen: set[tuple[str, str]] = set()
        installed: set[str] = set()
        for dist in metadata.distributions():
            dist_name = dist.metadata["Name"] or "?"
            installed.add(normalise_dist(dist_name))
            if allowed is not None and normalise_dist(dist_name) not in allowed:
                continue
            for ep in dist.entry_points:
                if ep.group != ENTRY_POINT_GROUP or (dist_name, ep.name) in seen:
                    continue
                seen.add((dist_name, ep.name))
                self._load_entry_point(ep, dist_name, dist.version)
        if allowed is not None:
            self.unknown_allowed = sorted(allowed - installed)
            for name in self.unknown_allowed:
                warn(f"{LOAD_VARIABLE} names {name!r}, which is not an installed distribution; "
                     f"installed distributions with specframe plugins: {', '.join(self._plugin_dists()) or '(none)'}",
                     PluginWarning)

    def _load_entry_point(self, ep: Any, dist_name: str, version: str) -> None:
        """Import and register one entry point; a failure skips it with a warning."""
        try:
            plugin = ep.load()
        except Exception as err:  # a broken third party must not break every command
            self._skip(dist_name, f"entry point {ep.name!r} ({ep.value}) failed to import", err)
            return
        self.register(plugin, dist=dist_name, version=version, name=f"{dist_name}:{ep.name}")

    def _skip(self, dist: str, what: str, err: BaseException) -> None:
        """Record and warn about a plugin that was skipped."""
        self.skipped.append((dist, f"{what}: {one_line(err)}"))
        warn(f"plugin distribution {dist!r} skipped: {what}: {one_line(err)}", PluginWarning)

    @staticmethod
    def _plugin_dists() -> list[str]:
        """Installed distributions exposing a ``specframe`` entry point (for messages)."""
        names = {dist.metadata["Name"] or "?" for dist in metadata.distributions()
                 if any(ep.group == ENTRY_POINT_GROUP for ep in dist.entry_points)}
        return sorted(names)

    def register(self, plugin: Any, dist: str = "<local>", version: str = "", name: str | None = None) -> None:
        """Register a plugin object (module or instance with hookimpls) from a distribution."""
        if self.pm.is_registered(plugin):
            return
        self.pm.register(plugin, name=name)
        self._origin[id(plugin)] = (dist, version)
        self._plugins = None

    def _collect(self) -> dict[str, dict[str, PluginInfo]]:
        if self._plugins is not None:
            return self._plugins
        found: dict[str, dict[str, PluginInfo]] = {kind: {} for kind in KINDS}
        broken: set[int] = set()
        for kind, hook_name in _HOOK_OF_KIND.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if id(impl.plugin) in broken:
                    continue
                dist, version = self._origin.get(id(impl.plugin), ("<local>", ""))
                staged: dict[str, PluginInfo] = dict(found[kind])
                try:
                    impl.function(register=self._registrar(staged, kind, dist, version))
                except PluginError:
                    raise  # a name clash is the user's to resolve: name both sides
                except Exception as err:  # a broken hook drops that distribution only
                    broken.add(id(impl.plugin))
                    self._skip(dist, f"hook {hook_name} raised", err)
                    continue
                found[kind] = staged
        self._plugins = found
        return found

    @staticmethod
    def _registrar(table: dict[str, PluginInfo], kind: str, dist: str, version: str):
        def register(cls: type) -> None:
            name = getattr(cls, "name", "")
            if not name:
                raise PluginError(f"{SINGULAR[kind]} class {cls.__qualname__} from {dist} has no `name`")
            if name in table and table[name].cls is not cls:
                raise PluginError(
                    f"{SINGULAR[kind]} name {name!r} registered twice: by {table[name].dist} "
                    f"({table[name].cls.__qualname__}) and by {dist} ({cls.__qualname__}): uninstall "
                    f"one, or load only one with {LOAD_VARIABLE}=<distribution>,..."
                )
            table[name] = PluginInfo(kind, name, cls, dist, version)

        return register

    def infos(self, kind: str) -> list[PluginInfo]:
        """All plugins of ``kind`` (policies, drafters or verifiers), sorted by name."""
        return sorted(self._collect()[kind].values(), key=lambda p: p.name)

    def names(self, kind: str, dist: str | None = None) -> list[str]:
        """Registered names of ``kind``, sorted; with ``dist``, only that distribution's
        (``"specframe"``: the built-ins, whatever else is installed beside them)."""
        return [p.name for p in self.infos(kind) if dist is None or normalise_dist(p.dist) == normalise_dist(dist)]

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name``; the error lists the available names."""
        table = self._collect()[kind]
        if name not in table:
            avail = ", ".join(sorted(table)) or "(none loaded)"
            raise PluginError(f"unknown {SINGULAR[kind]} {name!r}; available {kind}: {avail}{self._why_missing()}")
        return table[name].cls

    def _why_missing(self) -> str:
        """What may explain a missing plugin: the load variable, skipped distributions."""
        notes = []
        raw = os.environ.get(LOAD_VARIABLE, "").strip()
        if raw:
            notes.append(f"{LOAD_VARIABLE}={raw!r} restricts which distributions load; unset it to load all")
        notes += [f"{dist} was skipped ({reason})" for dist, reason in self.skipped]
        return "".join(f"; {n}" for n in notes)

    def commands_hook(self):
        """The ``register_commands`` hook caller."""
        return self.pm.hook.register_commands

    def register_commands(self, cli: Any) -> None:
        """Let every plugin add CLI commands; a hook that raises is skipped with a warning."""
        for impl in self.pm.hook.register_commands.get_hookimpls():
            dist, _version = self._origin.get(id(impl.plugin), ("<local>", ""))
            try:
                impl.function(cli=cli)
            except Exception as err:  # one broken plugin must not take the CLI down
                self._skip(dist, "hook register_commands raised", err)


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry (entry points loaded on first use)."""
    global _registry
    if _registry is None:
        _registry = Registry()
    return _registry


def reset_registry() -> None:
    """Forget the process-wide registry (e.g. after changing SPECFRAME_LOAD_PLUGINS)."""
    global _registry
    _registry = None


def available() -> dict[str, list[str]]:
    """Names of every registered policy, drafter and verifier."""
    reg = get_registry()
    return {kind: reg.names(kind) for kind in KINDS}


def register_plugin(plugin: Any, dist: str = "<local>") -> None:
    """Register a plugin object in the process-wide registry without an entry point."""
    get_registry().register(plugin, dist=dist)


def iter_plugin_names(kinds: Iterable[str] = KINDS) -> Iterable[tuple[str, str]]:
    """``(kind, name)`` pairs of every registered plugin."""
    reg = get_registry()
    for kind in kinds:
        for name in reg.names(kind):
            yield kind, name
