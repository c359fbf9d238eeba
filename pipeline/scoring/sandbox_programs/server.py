"""The HumanEval sandbox's server: runs inside bubblewrap as ``python -I -B -c <this file>``.

It executes prompt + completion, then answers calls of the entry point, one per request, with the
returned value as plain data (``codec.py``). Its pipe to the checker is moved to other descriptors;
0, 1 and 2 point to /dev/null while the completion runs. ``pipeline.scoring.humaneval`` builds the
program from this file (the codec's text in place of the import from it).
"""

if __name__ != "__main__":
    raise ImportError("a program that humaneval.py runs with `python -c`, not a module to import")
import os
import struct

_IN, _OUT = os.dup(0), os.dup(1)
_null = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(_null, _fd)
from pipeline.scoring.sandbox_programs.codec import _dec, _describe, _enc, _json  # noqa: E402 - inlined by the build, after the descriptors moved


def _send(obj):
    data = _json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(_OUT, data) :]


def _readn(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(_IN, n - len(buf))
        if not chunk:
            os._exit(0)
        buf += chunk
    return buf


def _recv():
    return _json.loads(_readn(struct.unpack(">I", _readn(4))[0]))


_send({"hello": 1})
_msg = _recv()
if _msg.get("max_tasks"):
    # processes and threads of this sandbox: counted per user namespace, enforced by the kernel for a
    # non-root scorer (the cgroup's pids.max does it where cgroups are writable); a thread costs kernel
    # memory (its kernel stack) that the address-space limit does not see
    import resource as _resource

    try:
        _resource.setrlimit(_resource.RLIMIT_NPROC, (_msg["max_tasks"], _msg["max_tasks"]))
    except (OSError, ValueError):
        pass
    del _resource
_globals: dict = {}
try:
    exec(compile(_msg["code"], "<humaneval>", "exec"), _globals)
except BaseException as _err:  # noqa: BLE001 - whatever the completion raises is reported as data
    _send({"error": _describe(_err)})
    os._exit(0)
_send({"ready": 1})
_fn = _globals.get(_msg["entry_point"]) if _msg["entry_point"] else None
while True:
    _req = _recv()
    try:
        # no entry point: calling None raises TypeError, the call's answer
        _answer = {"ok": _enc(_fn(*_dec(_req["args"]), **_dec(_req["kwargs"])), loose=True)}  # type: ignore[misc]
    except BaseException as _err:  # noqa: BLE001 - whatever the call raises is its answer
        _answer = {"raised": _describe(_err)}
    _send(_answer)
