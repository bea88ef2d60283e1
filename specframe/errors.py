"""One-line errors and warnings for users, and the debug switch that shows tracebacks.

Every fault a user can cause or meet (a bad file, a missing model, a plugin that raises) reaches
the command line as ``Error: <what> (<where>): <how to fix>`` with exit code 1 and no
traceback; ``specframe --debug`` or ``SPECFRAME_DEBUG=1`` re-raises instead, so the traceback
is there when a developer wants it. Warnings are one line too (``Warning: ...``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

DEBUG_VARIABLE = "SPECFRAME_DEBUG"


class SpecframeWarning(UserWarning):
    """Something was skipped, capped or repaired; the run goes on."""


class PluginWarning(SpecframeWarning):
    """A plugin distribution was skipped or ``SPECFRAME_LOAD_PLUGINS`` names an unknown one."""


class ExperimentError(RuntimeError):
    """An experiment run cannot proceed (incompatible old results, over-long prompt, ...)."""


class ContextError(RuntimeError):
    """An error from inside a run, re-raised with where it happened and how to proceed.

    ``cause`` keeps the original exception (also ``__cause__``) for ``--debug``.
    """

    def __init__(self, what: str, where: str, fix: str, cause: BaseException | None = None) -> None:
        super().__init__(format_error(what, where, fix))
        self.what, self.where, self.fix, self.cause = what, where, fix, cause

    def __reduce__(self) -> tuple:
        """Pickle from the parts (``args`` holds only the formatted message, which ``__init__``
        cannot take), so the error crosses process boundaries (sweep workers, Ray tasks)."""
        extra = {k: v for k, v in self.__dict__.items() if k not in ("what", "where", "fix", "cause")}
        return type(self), (self.what, self.where, self.fix, _portable(self.cause)), extra or None


def _portable(err: BaseException | None) -> BaseException | None:
    """``err`` if it survives a pickle round trip, else None (the message keeps its text):
    a plugin's exception with its own ``__init__`` often does not."""
    import pickle

    if err is None:
        return None
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return None
    return err


def format_error(what: str, where: str | None, fix: str | None) -> str:
    """``<what> (<where>): <how to fix>``, leaving out the parts that are empty."""
    text = what
    if where:
        text += f" ({where})"
    if fix:
        text += f": {fix}"
    return text


def one_line(err: BaseException) -> str:
    """An exception as one line: its message (or type when empty), newlines folded."""
    text = " ".join(str(err).split())
    if isinstance(err, KeyError) and len(err.args) == 1:
        text = f"missing key {err.args[0]!r}"
    if not text:
        return type(err).__name__
    # Messages of our own errors are written for users; others keep their type for context.
    if type(err).__module__.startswith("specframe") or isinstance(err, (FileNotFoundError, ValueError, LookupError)):
        return text
    return f"{type(err).__name__}: {text}"


def debug_enabled() -> bool:
    """True when ``SPECFRAME_DEBUG`` is set to something other than empty / 0 / false."""
    return os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def warn(message: str, category: type[Warning] = SpecframeWarning) -> None:
    """Emit a one-line specframe warning (shown as ``Warning: ...`` by the CLI)."""
    warnings.warn(message, category, stacklevel=2)


def install_warning_format() -> None:
    """Show specframe warnings as ``Warning: <message>`` on one line, without a source line (the
    models layer's :class:`~specframe.models.timing.BusyMachineWarning` too, which cannot
    subclass :class:`SpecframeWarning` from below the core)."""
    if getattr(warnings.formatwarning, "_specframe", False):
        return
    original = warnings.formatwarning

    from specframe.models.timing import BusyMachineWarning

    def formatwarning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> str:
        if issubclass(category, (SpecframeWarning, BusyMachineWarning)):
            return f"Warning: {message}\n"
        return original(message, category, *args, **kwargs)

    formatwarning._specframe = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning
