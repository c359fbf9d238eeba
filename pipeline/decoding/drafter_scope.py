"""The ``drafter`` parameter of a method: its values, its check, its resolution against the method's capabilities and
what the pair offers, and how a resolved scope builds its drafter.

``resolve_drafter`` is the one place that turns a method's ``drafter`` value into a resolved scope
``{kind: ..., <its parameters>}``: only that scope enters the method's parameters (and so the cell key), so a
new drafter changes no other cell. Short forms: ``drafter: ngram`` is ``{kind: ngram}`` with its defaults; top-level
``max_ngram`` / ``min_ngram`` fold into an ngram scope. ``pair`` (the default) takes the pair's ``drafter:`` setting
when the method accepts it, else ``model``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from .base import METHODS, Param
from .drafter_context import DRAFTERS, DrafterContext, eagle_version

if TYPE_CHECKING:
    from .drafters import Drafter

# The pseudo-kinds of the `drafter` parameter: values that name no plugin (no plugin may take them as its kind)
PAIR = "pair"  # the pair's own drafter (its `drafter:`) where the method takes it, else the draft model
DRAFT = "draft"  # typical's older name of the draft model (`model`), accepted where a method lists it (`extra`)


def drafter_class(kind: str) -> type["Drafter"]:
    """The drafter registered as ``kind`` (or ``module:attr`` of one); a clear error lists the kinds."""
    return DRAFTERS.get(kind)


def drafter_scope(value: Any) -> dict[str, Any]:
    """``value`` (a kind name or a ``{kind: ..., ...}`` mapping) as a mutable scope with ``kind``."""
    if isinstance(value, Mapping):
        if "kind" not in value:
            raise ValueError(f"drafter: {dict(value)!r} needs a `kind:` (one of {[PAIR, *DRAFTERS]})")
        return dict(value)
    return {"kind": value}


def check_drafter_value(extra: tuple[str, ...] = ()) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        kind = value.get("kind") if isinstance(value, Mapping) else value
        valid = [PAIR, *extra, *DRAFTERS]
        if isinstance(kind, str) and (kind in valid or ":" in kind):
            return None
        return (
            f"must be one of {valid} (or `module:attr` of a Drafter of your own) or a mapping "
            "{kind: <one of them>, <the drafter's parameters>}"
        )

    return check


def drafter_param(extra: tuple[str, ...] = (), help: str = "") -> Param:
    """The ``drafter`` parameter (any registered kind passes the type check; ``resolve_drafter`` says which
    ones the method accepts and why not the others)."""
    return Param(
        PAIR,
        check_drafter_value(extra),
        help or "who drafts: the pair's drafter (pair), a drafter kind, or {kind: ..., <its parameters>}",
    )


NGRAM_SHORT_FORMS = ("max_ngram", "min_ngram")


def fold_drafter_short_forms(params: dict[str, Any]) -> dict[str, Any]:
    """Top-level ``max_ngram`` / ``min_ngram`` (the pre-plugin form) move into the ``drafter`` scope."""
    short = {k: params.pop(k) for k in NGRAM_SHORT_FORMS if k in params}
    if short:
        params["drafter"] = {**drafter_scope(params.get("drafter", PAIR)), **short}
    return params


def accepted_kinds(method: Any, values: dict[str, Any]) -> list[str]:
    """The registered drafter kinds ``method`` (a Decoder class) takes with these parameters."""
    return DRAFTERS.names(where=lambda d: method.accepts(d, values) is None)


def methods_taking(kind: str) -> list[str]:
    """The registered methods that take drafter ``kind`` with their default parameters (for error messages)."""
    drafter = DRAFTERS.get(kind)
    out = []
    for name, cls in METHODS.items():
        if "drafter" in cls.params:
            defaults = {k: p.default for k, p in cls.all_params().items()}
            if cls.accepts(drafter, defaults) is None:
                out.append(name)
    return out


def resolve_drafter(method: Any, values: dict[str, Any], ctx: DrafterContext) -> None:
    """Resolve ``values['drafter']`` into ``{kind: ..., <the plugin's parameters, defaults filled>}`` and check
    it against the method's capabilities (``method.accepts``) and what the pair offers (``ctx``); ValueError
    names the fix. ``pair`` -> the pair's drafter when the method accepts it, else ``model``; ``eagle`` with an
    EAGLE-3 head -> ``eagle3``."""
    name = method.name
    scope = drafter_scope(values["drafter"])
    kind = scope.pop("kind")
    if kind == PAIR:
        base = drafter_scope(ctx.default) if ctx.default else {"kind": "model"}
        if base["kind"] == "eagle" and ctx.eagle_version == 3:
            base["kind"] = "eagle3"
        if method.accepts(drafter_class(base["kind"]), values) is not None:
            base = {"kind": "model"}
        kind = base.pop("kind")
        scope = {**base, **scope}
    if kind == "eagle" and (eagle_version(scope["path"]) if scope.get("path") else ctx.eagle_version) == 3:
        kind = "eagle3"  # the short form `drafter: eagle` with an EAGLE-3 folder
    try:
        plugin = drafter_class(kind)
    except ValueError as err:
        raise ValueError(f"method {name!r}: {err}") from None
    why = method.accepts(plugin, values)
    if why is not None:
        others = [m for m in methods_taking(kind) if m != name] if kind in DRAFTERS else []
        raise ValueError(
            f"method {name!r} cannot use drafter: {kind} ({why}); "
            f"use drafter: {' | '.join(accepted_kinds(method, values))}"
            + (f", or drafter: {kind} with {', '.join(others)}" if others else "")
        )
    unknown = sorted(set(scope) - set(plugin.params))
    if unknown:
        raise ValueError(
            f"method {name!r}: drafter {kind} has no parameter(s) {unknown}; "
            f"its parameters: {sorted(plugin.params) or 'none'}"
        )
    resolved = {k: scope.get(k, p.default) for k, p in plugin.params.items()}
    for k, v in resolved.items():
        problem = plugin.params[k].check(v)
        if problem:
            raise ValueError(f"method {name!r}: drafter {kind} parameter {k}={v!r} {problem}")
    plugin.check(name, resolved, ctx)
    values["drafter"] = {"kind": kind, **resolved}


def register_drafter(cls: type["Drafter"]) -> type["Drafter"]:
    """Make ``cls`` selectable as ``drafter: {kind: cls.kind, ...}`` (a taken kind is an error)."""
    if not cls.kind or cls.kind in (PAIR, DRAFT):
        raise ValueError(f"a drafter plugin needs a kind other than {PAIR}/{DRAFT}, got {cls.kind!r}")
    return DRAFTERS.register(cls)


def build_drafter(decoder, scope: Mapping[str, Any] | None = None) -> "Drafter":
    """The drafter a decoder's resolved ``drafter`` scope names, over its models and assets."""
    scope = dict(decoder.args.drafter if scope is None else scope)
    kind = scope.pop("kind")
    return drafter_class(kind).create(decoder, scope)


def optional_path(v: Any) -> str | None:
    return None if v is None or (isinstance(v, str) and v) else "must be a folder path or null (the pair's `eagle:`)"
