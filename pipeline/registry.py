"""One registry type for what a config names by name: methods, drafters, scorers.

After lm-evaluation-harness's registries: an entry is registered once under its name (a second entry
under a taken name is an error, not a silent replacement), and a config may also name an entry of the
user's own as ``module:attr`` (``mypkg.rules:MyRule``), which is imported where it is used, on the
driver and on the Ray workers alike (the module must be importable there: ``PYTHONPATH`` or the job's
``runtime_env``). Entries declare their capabilities themselves (a method's draft shape, whether it is
lossless or batchable, the assets it needs; a drafter's proposal shapes); the sweep, the cell, the bench,
the analysis and the error messages ask the registry (``names(where=...)``) instead of keeping lists.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
# a registered name: it names files (docs_gen writes conf/method/<name>.yaml) and config groups, so never a path
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


class RegistryError(ValueError):
    """A name that is not registered, cannot be imported, or is taken; the message names the fix."""


def import_attr(name: str, what: str) -> Any:
    """The object ``module:attr`` names (``attr`` may be dotted); RegistryError naming the fix."""
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise RegistryError(f"{what} {name!r}: name `module:attr`, e.g. mypkg.rules:MyRule")
    if module.startswith("."):
        raise RegistryError(
            f"{what} {name!r}: a relative module cannot be imported by the Ray workers; give the absolute "
            f"module path (e.g. mypkg{module}:{attr})"
        )
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as err:
        raise RegistryError(
            f"{what} {name!r} cannot be imported ({err}); put its module on the Python path "
            "(PYTHONPATH, and the Ray job's runtime_env on a cluster)"
        ) from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the module raised at import: the usual refusal, no traceback
        raise RegistryError(
            f"{what} {name!r}: importing module {module!r} raised {type(err).__name__}: {err}; fix the module "
            f"{module!r} (or leave {name!r} out of the config)"
        ) from None
    return found


class Registry(Generic[T]):
    """Named entries of one kind. ``register`` refuses a taken name; ``get`` also resolves ``module:attr``.

    ``check(entry)`` (optional) raises on an object that is not an entry of this kind (a ``module:attr``
    naming a function where a class is expected); ``name_of(entry)`` reads an entry's own name.
    """

    def __init__(
        self,
        kind: str,
        name_of: Callable[[T], str] = lambda e: e.name,  # type: ignore[attr-defined]
        check: Callable[[T], str | None] | None = None,
    ) -> None:
        self.kind = kind
        self._name_of = name_of
        self._check = check
        self._entries: dict[str, T] = {}

    def register(self, entry: T, name: str | None = None) -> T:
        """Add ``entry`` under ``name`` (default: its own); usable as a class decorator."""
        name = name or self._name_of(entry)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RegistryError(
                f"a {self.kind} needs a plain name to be registered (letters, digits, '_' and '-', not first), got "
                f"{name!r}: names become file names (conf/method/<name>.yaml), so no ':', '/', '.' or spaces"
            )
        problem = self._check(entry) if self._check else None
        if problem:
            raise RegistryError(f"{self.kind} {name!r}: {problem}")
        old = self._entries.get(name)
        if old is not None and old is not entry:
            raise RegistryError(
                f"{self.kind} name {name!r} is taken by {_where(old)}; register {_where(entry)} under "
                f"another name (or name it in configs as `module:attr`)"
            )
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return an entry (tests that stand in for an older registry)."""
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        """The entry registered as ``name``, or the object ``module:attr`` names (checked like a registered one)."""
        if name in self._entries:
            return self._entries[name]
        if isinstance(name, str) and ":" in name:
            entry = import_attr(name, self.kind)
            problem = self._check(entry) if self._check else None
            if problem:
                raise RegistryError(f"{self.kind} {name!r}: {problem}")
            return entry
        raise RegistryError(
            f"unknown {self.kind} {name!r}; valid {self.kind}s: the registered {self.kind}s {sorted(self._entries)}, "
            f"or `module:attr` of your own"
        )

    def names(self, where: Callable[[T], bool] | None = None) -> list[str]:
        """Registered names in registration order, those whose entry satisfies ``where`` when given."""
        return [n for n, e in self._entries.items() if where is None or where(e)]

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


def _where(entry: Any) -> str:
    module = getattr(entry, "__module__", None) or type(entry).__module__
    name = getattr(entry, "__qualname__", None) or type(entry).__qualname__
    return f"{module}:{name}"
