"""The plain-data codec of the HumanEval sandbox's two programs (``server.py``, ``checker.py``).

Not imported: ``pipeline.scoring.humaneval`` inlines this file's text where a program imports from it,
so each program stays one self-contained ``python -c`` source (the sandbox sees no project files).
Values cross the pipe as tagged JSON: None/bool/int/float/complex/str/bytes/list/tuple/dict/set;
numpy scalars as their Python value; anything else is an error.

Decoding is bounded, since the checker decodes what the sandboxed program chose to send (outside the
sandbox's limits): at most ``_MAX_ITEMS`` values per message, and no set or dict whose keys collide
(more than ``_MAX_SAME_HASH`` keys of one hash: ints, floats and tuples have hashes an adversary can
choose, and inserting n colliding keys costs n**2 comparisons; 290,000 such ints kept a checker busy
for 29 s). A real set never needs it: equal keys are one key, distinct keys of realistic data almost
never share a hash.
"""

import json as _json  # noqa: F401 - used by the programs that inline this file

_MAX_DEPTH = 200
_MAX_ITEMS = 200_000
_MAX_SAME_HASH = 32


def _enc(x, depth=0, loose=False):
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None:
        return {"n": 0}
    if t is bool:
        return {"b": x}
    if t is int:
        return {"i": hex(x)}
    if t is float:
        return {"f": float.__repr__(x)}
    if t is complex:
        return {"c": [float.__repr__(x.real), float.__repr__(x.imag)]}
    if t is str:
        return {"s": x}
    if t is bytes:
        return {"y": x.hex()}
    if t in (list, tuple, set, frozenset):
        tags: dict[type, str] = {list: "l", tuple: "t", set: "set", frozenset: "fs"}
        tag = tags[t]
        return {tag: [_enc(v, depth + 1, loose) for v in x]}
    if t is dict:
        return {"d": [[_enc(k, depth + 1, loose), _enc(v, depth + 1, loose)] for k, v in x.items()]}
    if loose and t.__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return _enc(x.item(), depth, loose)
    raise TypeError("cannot pass a %s value between the sandbox and the checker" % t.__name__)


class _Budget:
    """How many more values one message may decode to."""

    def __init__(self, items):
        self.left = items

    def take(self):
        self.left -= 1
        if self.left < 0:
            raise ValueError("answer holds more than %d values" % _MAX_ITEMS)


def _no_collisions(keys):
    # counting hashes is linear; a set or dict built from keys that pass is too
    seen: dict = {}
    for k in keys:
        h = hash(k)
        n = seen.get(h, 0) + 1
        if n > _MAX_SAME_HASH:
            raise ValueError("a set or dict whose keys share one hash (%d or more)" % n)
        seen[h] = n
    return keys


def _dec(o, depth=0, budget=None):
    if budget is None:
        budget = _Budget(_MAX_ITEMS)
    budget.take()
    if depth > _MAX_DEPTH or type(o) is not dict or len(o) != 1:
        raise ValueError("malformed value")
    ((tag, v),) = o.items()
    if tag == "n":
        return None
    if tag == "b" and type(v) is bool:
        return v
    if tag == "i" and type(v) is str:
        return int(v, 16)
    if tag == "f" and type(v) is str:
        return float(v)
    if tag == "c" and type(v) is list and len(v) == 2:
        return complex(float(v[0]), float(v[1]))
    if tag == "s" and type(v) is str:
        return v
    if tag == "y" and type(v) is str:
        return bytes.fromhex(v)
    if tag in ("l", "t") and type(v) is list:
        items = [_dec(e, depth + 1, budget) for e in v]
        return items if tag == "l" else tuple(items)
    if tag in ("set", "fs") and type(v) is list:
        items = _no_collisions([_dec(e, depth + 1, budget) for e in v])
        return set(items) if tag == "set" else frozenset(items)
    if tag == "d" and type(v) is list:
        if any(type(p) is not list or len(p) != 2 for p in v):
            raise ValueError("malformed value")
        pairs = [(_dec(p[0], depth + 1, budget), _dec(p[1], depth + 1, budget)) for p in v]
        _no_collisions([k for k, _ in pairs])
        return dict(pairs)
    raise ValueError("malformed value")


def _describe(err):
    try:
        message = str(err)
    except BaseException:  # noqa: BLE001 - an exception whose str() raises is still described
        message = ""
    text = "%s: %s" % (type(err).__name__, message) if message else type(err).__name__
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."
