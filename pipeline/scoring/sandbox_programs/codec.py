"""The plain-data codec of the HumanEval sandbox's two programs (``server.py``, ``checker.py``).

Not imported: ``pipeline.scoring.humaneval`` inlines this file's text where a program imports from it,
so each program stays one self-contained ``python -c`` source (the sandbox sees no project files).
Values cross the pipe as tagged JSON: None/bool/int/float/complex/str/bytes/list/tuple/dict/set;
numpy scalars as their Python value; anything else is an error.
"""

import json as _json  # noqa: F401 - used by the programs that inline this file

_MAX_DEPTH = 200

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
        tag = {list: "l", tuple: "t", set: "set", frozenset: "fs"}[t]
        return {tag: [_enc(v, depth + 1, loose) for v in x]}
    if t is dict:
        return {"d": [[_enc(k, depth + 1, loose), _enc(v, depth + 1, loose)] for k, v in x.items()]}
    if loose and t.__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return _enc(x.item(), depth, loose)
    raise TypeError("cannot pass a %s value between the sandbox and the checker" % t.__name__)

def _dec(o, depth=0):
    if depth > _MAX_DEPTH or type(o) is not dict or len(o) != 1:
        raise ValueError("malformed value")
    (tag, v), = o.items()
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
    if tag in ("l", "t", "set", "fs") and type(v) is list:
        items = [_dec(e, depth + 1) for e in v]
        return {"l": list, "t": tuple, "set": set, "fs": frozenset}[tag](items)
    if tag == "d" and type(v) is list:
        return {_dec(p[0], depth + 1): _dec(p[1], depth + 1) for p in v if type(p) is list and len(p) == 2}
    raise ValueError("malformed value")

def _describe(err):
    try:
        message = str(err)
    except BaseException:  # noqa: BLE001 - an exception whose str() raises is still described
        message = ""
    text = "%s: %s" % (type(err).__name__, message) if message else type(err).__name__
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."
