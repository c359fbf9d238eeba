"""The CPU's precision capability and the engine's bf16 decoder kernels (``csrc/bf16_decoder.cpp``).

``native_bf16()`` says whether this CPU has native bf16 dot products (AVX512_BF16 or AMX-BF16, read
from ``/proc/cpuinfo``). ``kernels_isa()`` names the instruction set the kernels are built for here:
``avx512`` (AVX512_BF16: VDPBF16PS), ``avx2`` (AVX2 + FMA: the same code through ``csrc/avx512_on_avx2.h``,
bf16 weights widened to float32 in registers; decoding is memory-bound, so half the bytes of float32
weights is most of the gain), or None. ``resolve_dtype("auto", device)`` is bf16 on CUDA and on CPUs
where the kernels run, float32 elsewhere. ``PIPELINE_CPU_BF16=0`` turns bf16 and the kernels off (float32
and today's kernels), ``=1`` forces bf16 on.

``kernels()`` builds the C++ extension once per machine (``torch.utils.cpp_extension``: g++ and ninja, before
any cell is timed: ``prepare_pair``; cached under ``$PIPELINE_CACHE/torch_extensions``) for the instruction
set this machine really has, and returns it, or None where it cannot be used (no capability, no compiler,
``PIPELINE_BF16_KERNELS=0``); the reason is ``kernels_unavailable_reason()``. One build at a time per folder:
``build_lock`` holds ``fcntl.flock`` on ``<folder>/build.flock`` around the build and the load, a lock the kernel
drops when its holder dies, however it dies; the folder is one per source, flags, torch and Python (``build_folder``),
and a finished build (its ``BUILT`` mark: the library's size and sha256, written after it loaded) is imported from
any checkout without ninja, while a library truncated or changed since, or one that does not import, is removed and
built again; the lock file is never opened through a link (a shared cache is not trusted); builders use it only
under that lock, so a torch ``lock`` baton found in it by the lock's holder is a killed build's (torch's
``FileBaton`` outlives its process and would make every later load wait forever) and is removed. A wait longer than
a build (``BUILD_NOTICE_S``) says so on stderr, and after ``PIPELINE_KERNELS_BUILD_WAIT_S`` (default 1800 s) the
kernels are given up for this process (the reason recorded, the engine on oneDNN). ``kernel_path(device, dtype)``
names the path a model's steps take, recorded with every cell and bench row:

- ``bf16-avx512`` / ``bf16-avx2``: our C++ decoder (all layers in one call, batch-invariant rows);
- ``bf16-onednn``: bf16 weights through ``F.linear`` (oneDNN) when the extension is unavailable;
- ``fp32-fast-matmul`` / ``fp32-linear``: float32 on the CPU (``fast_forward.small_linear``);
- ``cuda-<dtype>``: PyTorch's CUDA kernels.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

_SRC = Path(__file__).resolve().parent / "csrc" / "bf16_decoder.cpp"
_SHIM = _SRC.parent / "avx512_on_avx2.h"  # included by _SRC on AVX2; its digest is a build flag (see _build)
_COMMON_CFLAGS = ["-O3", "-fno-math-errno", "-fopenmp"]
_ISA_CFLAGS = {  # the instruction set -> its compiler flags (avx2: the header emulates the AVX-512 names)
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma"],
    "avx2": ["-mavx2", "-mfma"],
}
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}
DTYPE_NAMES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}  # short spellings -> torch's names


def env_flag(name: str, default: bool = True) -> bool:
    """An on/off environment switch: unset -> ``default``; ``0``, ``false``, ``no``, ``off`` or empty -> off."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def _cpu_flags() -> frozenset[str]:
    """The CPU flags the capability is judged from (tests see the machine as another CPU through this)."""
    return _machine_flags()


@functools.lru_cache(maxsize=1)
def _machine_flags() -> frozenset[str]:
    """This machine's CPU flags as ``/proc/cpuinfo`` reports them: what the kernels are compiled for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_bf16_flags() -> list[str]:
    """This CPU's native bf16 features (``avx512_bf16``, ``amx_bf16``), as the kernel reports them."""
    return sorted(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def _isa_of(flags: frozenset[str]) -> str | None:
    if "avx512_bf16" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return None


def kernels_isa() -> str | None:
    """The instruction set of the kernels here: the built extension's, else the CPU's (``avx512``, ``avx2``)."""
    isa = _STATE.get("isa")
    return isa if isinstance(isa, str) and isa else _isa_of(_cpu_flags())


def native_bf16() -> bool:
    """Whether this CPU computes bf16 dot products natively (``PIPELINE_CPU_BF16`` overrides)."""
    forced = os.environ.get("PIPELINE_CPU_BF16")
    if forced is not None and forced.strip() != "":
        return env_flag("PIPELINE_CPU_BF16")
    return "avx512_bf16" in _cpu_flags()


def resolve_dtype(dtype: str, device: torch.device | str, kernels: bool = True) -> str:
    """``auto`` -> ``bfloat16`` on CUDA and on CPUs where it pays (``bf16_default``), else ``float32``; names pass
    through. ``kernels=False``: a model that runs through transformers' own forward, never the engine's kernels (a
    local judge's ``generate``): on a CPU bf16 only where it is native (elsewhere oneDNN's bf16 is slow: a 280-token
    pass 3.6x the kernels' time, benchmarks/notes-cpu-bench-history.md)."""
    if dtype != "auto":
        return dtype
    if isinstance(device, str) and device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    if dev.type == "cpu":
        return "bfloat16" if (bf16_default() if kernels else native_bf16()) else "float32"
    return "float32"


def bf16_default() -> bool:
    """Whether ``auto`` is bf16 on this CPU: native bf16, or AVX2 + FMA for the kernels (``PIPELINE_CPU_BF16``
    overrides; ``PIPELINE_BF16_KERNELS=0`` leaves an AVX2 CPU in float32, where bf16 would run through oneDNN)."""
    forced = os.environ.get("PIPELINE_CPU_BF16")
    if forced is not None and forced.strip() != "":
        return env_flag("PIPELINE_CPU_BF16")
    return native_bf16() or (_isa_of(_cpu_flags()) == "avx2" and env_flag("PIPELINE_BF16_KERNELS"))


def _capability_reason() -> str | None:
    """Why this machine and its switches rule the kernels out (None: they can run here)."""
    return _reason_for(
        os.environ.get("PIPELINE_BF16_KERNELS"), os.environ.get("PIPELINE_CPU_BF16"), _isa_of(_cpu_flags())
    )


@functools.lru_cache(maxsize=16)
def _reason_for(kernels_switch: str | None, bf16_switch: str | None, isa: str | None) -> str | None:
    """``_capability_reason`` for these switches and CPU (asked on every warped row: cached)."""
    if not env_flag("PIPELINE_BF16_KERNELS"):
        return "PIPELINE_BF16_KERNELS=0"
    if isa is None:
        return "the CPU has neither avx512_bf16 nor avx2 with fma"
    if not bf16_default():
        return "PIPELINE_CPU_BF16=0"
    return None


def kernels_unavailable_reason() -> str | None:
    """Why the bf16 extension is not used here (None when it is, or has not been tried yet and can be)."""
    error = _STATE.get("error")
    return _capability_reason() or (error if isinstance(error, str) else None)


def kernels():
    """The compiled bf16 decoder extension, or None where it is unavailable (see the module doc)."""
    if kernels_unavailable_reason() is not None:
        return None
    if "module" in _STATE:
        return _STATE["module"]
    with _LOCK:
        if "module" not in _STATE and "error" not in _STATE:
            try:
                _STATE["module"] = _build()
            except Exception as err:  # noqa: BLE001 - no compiler or a failed build: the engine keeps oneDNN, the reason is recorded
                last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
                _STATE["error"] = f"the bf16 kernels did not build ({type(err).__name__}: {last})"
    return _STATE.get("module")


BUILD_NOTICE_S = 120.0  # a build takes ~50 s on one core: a wait past this says whom it waits for
BUILD_WAIT_S = 1800.0  # PIPELINE_KERNELS_BUILD_WAIT_S: the longest wait for another process's build


def _wait_limit() -> float:
    raw = os.environ.get("PIPELINE_KERNELS_BUILD_WAIT_S", "")
    try:
        value = float(raw) if raw.strip() else BUILD_WAIT_S
    except ValueError:
        value = BUILD_WAIT_S
    return value if value == value and value >= 0 else BUILD_WAIT_S  # NaN or negative: the default


@contextlib.contextmanager
def build_lock(
    folder: Path,
    *,
    stale: tuple[str, ...] = (),
    notice_s: float = BUILD_NOTICE_S,
    wait_s: float | None = None,
    what: str = "the bf16 kernels' build lock",
) -> Iterator[None]:
    """Hold the build lock of ``folder``: an exclusive ``fcntl.flock`` on ``folder/build.flock``, which the kernel
    releases when the holder exits or is killed, so no dead builder blocks a later one. Inside it the files named
    ``stale`` (torch's ``lock`` baton, which only a builder inside this lock creates) can only be a dead builder's
    and are removed. Waiting longer than ``notice_s`` prints who holds it (every ``notice_s``); past ``wait_s``
    (default ``PIPELINE_KERNELS_BUILD_WAIT_S``) a TimeoutError naming the holder. ``what`` names the lock in those
    messages (``models`` holds one over each GGUF conversion too)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "build.flock"
    limit = _wait_limit() if wait_s is None else wait_s
    fd = _open_lock_file(path)
    try:
        start, notice = time.monotonic(), notice_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                holder = _holder(path)
                if waited >= limit:
                    raise TimeoutError(
                        f"waited {waited:.0f} s for {what} {path} ({holder}); a build takes about a "
                        "minute: check that process, or raise PIPELINE_KERNELS_BUILD_WAIT_S"
                    ) from None
                if waited >= notice:
                    print(
                        f"pipeline: waiting {waited:.0f} s for {what} {path} ({holder}), "
                        "longer than a build takes; the lock ends with its process",
                        file=sys.stderr,
                        flush=True,
                    )
                    notice += notice_s
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        for name in stale:
            baton = folder / name
            if baton.exists():
                print(f"pipeline: removing {baton}, left by a build that was killed", file=sys.stderr, flush=True)
                baton.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # drops the flock


def _open_lock_file(path: Path) -> int:
    """The lock file opened for writing its holder's pid: never through a symbolic link (a link planted in a shared
    cache would have every builder overwrite its target) and only a regular file (a FIFO would block its reader)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as err:
        if path.is_symlink():
            raise OSError(err.errno, f"{path} is a symbolic link, not a lock file: remove it (rm {path})") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file, not a lock file: remove it (rm {path})")
    return fd


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"held by pid {pid}" if pid.isdigit() else "holder unknown"


def build_folder(root: Path, isa: str, cflags: list[str]) -> Path:
    """The build folder of these sources and flags under ``root``:
    ``bf16_decoder-<isa>-torch<version>-<python tag>-<digest>`` (the digest of the C++ source, its header and the
    flags). Everything the built library depends on is in the name (the ABI of this torch and this Python), and
    nothing else: checkouts and virtual environments with the same sources, torch and Python share one build."""
    abi = f"cxx11abi={int(torch.compiled_with_cxx11_abi())}"
    digest = hashlib.sha256(_SRC.read_bytes() + _SHIM.read_bytes() + " ".join([*cflags, abi]).encode()).hexdigest()[:12]
    version = torch.__version__.replace("+", "_")
    return root / f"bf16_decoder-{isa}-torch{version}-{sys.implementation.cache_tag}-{digest}"


BUILT = "built.ok"  # written into the build folder after a build loaded: its library's size and sha256
_PT_LOAD = 1


def _elf_complete(library: Path) -> bool:
    """Whether ``library`` is a whole 64-bit little-endian ELF file: every loaded segment and the section table lie
    inside it (a truncated shared library would kill the process that maps it with SIGBUS, past any ``except``)."""
    try:
        size = library.stat().st_size
        with open(library, "rb") as fh:
            head = fh.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return False
            phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
            if phentsize < 56 or phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
                return False
            fh.seek(phoff)
            table = fh.read(phnum * phentsize)
    except OSError:
        return False
    for i in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == _PT_LOAD and offset + filesz > size:
            return False
    return True


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _built_library(build: Path, name: str) -> Path | None:
    """The library a finished build (its ``BUILT`` mark) left in ``build``, else None. The mark must be a regular
    file, the library a whole ELF file and, where the mark records one (every mark since issue 57), of the size and
    sha256 the build left: a library truncated or changed since is not taken as built (and is rebuilt)."""
    library, mark = build / f"{name}.so", build / BUILT
    try:
        if not stat.S_ISREG(mark.lstat().st_mode) or not stat.S_ISREG(library.lstat().st_mode):
            return None
        text = mark.read_text()
    except OSError:
        return None
    if not _elf_complete(library):
        return None
    try:
        recorded = json.loads(text)
    except ValueError:
        recorded = None  # a mark before issue 57 (the interpreter's path): the ELF check is all there is
    if isinstance(recorded, dict):
        try:
            if recorded.get("size") != library.stat().st_size or recorded.get("sha256") != _digest(library):
                return None
        except OSError:
            return None
    return library


def _load_built(build: Path, name: str):
    """The extension a finished build left in ``build`` (None if there is none, or it does not import): imported as
    it is, not through ``cpp_extension.load``, whose ninja file names this checkout's source path and this
    environment's torch headers, so another checkout or environment would rebuild it."""
    library = _built_library(build, name)
    if library is None:
        return None
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as err:  # damaged in a way the checks miss: rebuilt under the lock (_build)
        print(f"pipeline: {library} does not import ({err}); rebuilding it", file=sys.stderr, flush=True)
        return None
    return module


def _discard(build: Path, name: str) -> None:
    """Under the build lock: remove a mark and a library that did not verify or import, so ninja links anew."""
    for path in (build / BUILT, build / f"{name}.so"):
        if path.is_symlink() or path.exists():
            print(f"pipeline: removing {path}: its build is damaged", file=sys.stderr, flush=True)
            path.unlink(missing_ok=True)


def _mark_built(build: Path, name: str) -> None:
    """Under the build lock, after the library loaded: check it is a whole ELF file, then write the ``BUILT`` mark
    (its size and sha256) as a new file, never through a link."""
    library = build / f"{name}.so"
    if not _elf_complete(library):
        raise RuntimeError(f"the build left an incomplete library {library}")
    mark = build / BUILT
    mark.unlink(missing_ok=True)  # a link or an old mark: the mark is a file of its own
    fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump({"size": library.stat().st_size, "sha256": _digest(library), "python": sys.executable}, fh)


_build_folder = build_folder  # what _build calls (a test points it at a folder of its own)


def _plan() -> tuple[str, list[str], Path, str]:
    """(isa, cflags, build folder, module name) of this machine's build."""
    root = Path(os.environ.get("PIPELINE_CACHE", Path.home() / ".cache" / "pipeline")) / "torch_extensions"
    # compiled for what this machine runs, whatever the flags the capability is judged from say
    isa = _isa_of(_machine_flags())
    if isa is None:
        raise RuntimeError("this machine's CPU has neither avx512_bf16 nor avx2 with fma")
    # torch rebuilds when the sources or the flags change; the header is neither, so its digest is a flag
    shim = hashlib.sha256(_SHIM.read_bytes()).hexdigest()[:16]
    cflags = _COMMON_CFLAGS + _ISA_CFLAGS[isa] + [f"-DPIPELINE_SHIM_DIGEST={shim}"]
    return isa, cflags, _build_folder(root, isa, cflags), f"pipeline_bf16_decoder_{isa}"


def is_built() -> bool:
    """Whether this machine's kernels are built already (``kernels()`` then imports them; no compiler runs)."""
    if _capability_reason() is not None:
        return False
    _isa, _cflags, build, name = _plan()
    return _built_library(build, name) is not None


def _build():
    from torch.utils import cpp_extension  # noqa: PLC0415 - imports setuptools machinery; only when the kernels are wanted

    # ninja from the virtual environment (requirements.lock) when the shell's PATH has none
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), bindir])
    # one folder per source, flags, torch and Python (build_folder): checkouts with other sources never rebuild each
    # other's extension, and only builders under build_lock ever use the folder, so a torch `lock` baton found there
    # while holding the lock is a killed build's (torch's FileBaton outlives its process; load would wait
    # forever on it)
    isa, cflags, build, name = _plan()
    module = _load_built(build, name)
    if module is None:
        with build_lock(build, stale=("lock",)):
            module = _load_built(build, name)  # built by the process this one waited for
            if module is None:
                if (build / BUILT).exists() or (build / BUILT).is_symlink():
                    _discard(build, name)  # marked, but it did not verify or import
                module = cpp_extension.load(
                    name=name,
                    sources=[str(_SRC)],
                    extra_cflags=cflags,
                    extra_ldflags=["-fopenmp"],
                    extra_include_paths=[str(_SRC.parent)],
                    build_directory=str(build),
                    verbose=False,
                )
                _mark_built(build, name)
    _STATE["isa"] = isa
    return module


def kernel_path(device: torch.device | str, dtype: torch.dtype | str, build: bool = True) -> str:
    """The kernels a model of ``dtype`` on ``device`` runs on (``kernels()`` is built if needed; with
    ``build=False`` the path is predicted from the capability without building)."""
    dev = torch.device(device)
    torch_dtype: torch.dtype = getattr(torch, DTYPE_NAMES.get(dtype, dtype)) if isinstance(dtype, str) else dtype
    if dev.type == "cpu" and torch_dtype == torch.bfloat16:
        if build:  # the extension this process runs
            available, isa = kernels() is not None, kernels_isa()
        else:  # predicted from the capability (a plan's key: the CPU it is judged for, not the build at hand)
            available, isa = _capability_reason() is None, _isa_of(_cpu_flags())
        return f"bf16-{isa}" if available else "bf16-onednn"
    return fallback_path(dev, torch_dtype)


def fallback_path(device: torch.device, dtype: torch.dtype) -> str:
    """The path of a model that does not run on the bf16 kernels (``bf16-onednn`` for bf16 on a CPU)."""
    short = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype).replace("torch.", "")
    )
    if device.type != "cpu":
        return f"{device.type}-{short}"
    if dtype == torch.bfloat16:
        return "bf16-onednn"
    if dtype == torch.float32:
        return "fp32-fast-matmul" if env_flag("PIPELINE_FAST_MATMUL") else "fp32-linear"
    return f"cpu-{short}"


def precision_info(device: torch.device | str, dtypes: dict[str, str], build: bool = True) -> dict[str, object]:
    """What a cell or bench records of its precision: per model (``dtypes``: role -> requested dtype) the
    resolved dtype and kernel path, and the CPU's bf16 capability."""
    info: dict[str, object] = {"cpu_bf16": native_bf16(), "cpu_bf16_flags": ",".join(cpu_bf16_flags()) or "none"}
    for role, dtype in dtypes.items():
        resolved = resolve_dtype(dtype, device)
        name = DTYPE_NAMES.get(resolved, resolved)
        info[f"{role}_dtype"] = name
        info[f"{role}_kernels"] = kernel_path(device, name, build=build)
    return info
