"""Teacher-data shards on disk: ``shard-XXXX.pt`` (``torch.save`` of the records' dicts) or ``shard-XXXX.npz`` (the
compact arrays a GPU node returns within its 16 MiB files), written by ``teacher_data.generate_teacher_data`` and
read by the distillation (``load_records``), and the folder's ``manifest.json``: the generation's settings (a run
resumes only with the same ones) and every finished shard's size, SHA-256 and counts.

Shards come from other machines (a GPU node's bundles), so nothing in one is trusted: an ``.npz``'s arrays are sized
from their headers before any is read (a small file that declares a huge array is refused without allocating it),
and every record is checked (its start inside its length, ids inside the vocabulary, log-probs finite, <= 0 and
summing to at most 1) before it reaches the training loop. Every file here is written to a temporary name and renamed
into place, so a killed run leaves whole files or none."""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

SHARD_FORMATS = ("pt", "npz")
KINDS = ("gen", "gen2", "tf")
MANIFEST = "manifest.json"
SHARD_NAME = re.compile(r"shard-\d{4}\.(pt|npz)")
# what one shard may declare (a GPU shard of 256 conversations at top-32: ~0.1M answer positions, 2.6M top-k cells);
# at these bounds a shard loads in ~0.6 GB
MAX_RECORDS = 1 << 16
MAX_IDS = 1 << 24  # prompt + answer tokens of all records
MAX_TOPK_CELLS = 1 << 26  # answer positions x K
MAX_K = 1024
NPZ_ARRAYS = {  # name: (dimensions, the dtypes save_shard writes)
    "ids": (1, ("<u2", "<i4")),
    "lengths": (1, ("<i4",)),
    "starts": (1, ("<i4",)),
    "kinds": (1, ("|u1",)),
    "topk_ids": (2, ("<u2", "<i4")),
    "topk_logp": (2, ("<f2",)),
}
MASS_SLACK = 0.02  # a row's top-k probabilities sum to at most 1 (+ fp16 rounding)


class TeacherDataError(ValueError):
    """Teacher data that cannot be trained on or resumed: the message names the file (and record) and the fix."""


def shard_files(data_dir: Path) -> list[Path]:
    """The teacher shards in ``data_dir`` (``shard-XXXX.pt`` and ``shard-XXXX.npz``), in shard order."""
    return sorted(p for fmt in SHARD_FORMATS for p in Path(data_dir).glob(f"shard-*.{fmt}"))


def write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    """``write(f)`` into a temporary file beside ``path``, flushed to disk, then renamed onto ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)`` that leaves either the whole file or none (the held-out sets)."""
    write_atomic(path, lambda f: torch.save(obj, f))


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_shard(records: list[Any], path: Path) -> None:
    """Write ``records`` (``teacher_data.Record``s) to ``path`` (atomically): ``.pt`` is ``torch.save`` of their
    dicts; ``.npz`` is the compact form (``numpy.savez_compressed``): every record's ids in one array, the top-k rows
    of all answer positions in two ``[N, K]`` arrays, ids as uint16 when the vocabulary fits (49,152 here),
    log-probs float16. At K = 32 that is 128 bytes an answer token (the ``.pt`` form: 192) before zlib."""
    path = Path(path)
    if path.suffix == ".pt":
        save_atomic([r.__dict__ for r in records], path)
        return
    if path.suffix != ".npz":
        raise ValueError(f"a shard is .pt or .npz, not {path.name}")
    if not records:
        raise ValueError(f"{path.name}: no records to write")
    ids = torch.cat([r.ids for r in records])
    topk_ids = torch.cat([r.topk_ids for r in records])
    top = max(int(ids.max()), int(topk_ids.max()))
    id_type = np.uint16 if top < 2**16 else np.int32
    arrays: dict[str, Any] = dict(
        ids=ids.numpy().astype(id_type),
        lengths=np.array([len(r.ids) for r in records], dtype=np.int32),
        starts=np.array([r.start for r in records], dtype=np.int32),
        kinds=np.array([KINDS.index(r.kind) for r in records], dtype=np.uint8),
        topk_ids=topk_ids.numpy().astype(id_type),
        topk_logp=torch.cat([r.topk_logp for r in records]).to(torch.float16).numpy(),
    )
    write_atomic(path, lambda f: np.savez_compressed(f, **arrays))


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The arrays' shapes of an ``.npz`` shard read from their headers alone, each checked against what
    ``save_shard`` writes (names, dtypes, dimensions, the bytes the zip holds) and against the bounds above."""
    name = path.name
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {i.filename: i for i in zf.infolist()}
            if sorted(infos) != sorted(f"{k}.npy" for k in NPZ_ARRAYS):
                raise TeacherDataError(f"{name}: holds {sorted(infos)[:8]}, not a shard's arrays: {AGAIN}")
            for key, (ndim, dtypes) in NPZ_ARRAYS.items():
                info = infos[f"{key}.npy"]
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version not in ((1, 0), (2, 0)):
                        raise TeacherDataError(f"{name}: {key} has .npy format {version}: {AGAIN}")
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, fortran, dtype = read(f)
                    header = f.tell()
                if dtype.str not in dtypes or fortran or len(shape) != ndim:
                    raise TeacherDataError(f"{name}: {key} is {dtype.str} {shape}, not what a shard holds: {AGAIN}")
                if info.file_size != header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                    raise TeacherDataError(f"{name}: {key} declares {shape} but the file holds other sizes: {AGAIN}")
                shapes[key] = tuple(int(s) for s in shape)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        if isinstance(err, TeacherDataError):
            raise
        raise TeacherDataError(f"{name}: not a readable shard ({err}): {AGAIN}") from None
    n, rows = shapes["lengths"][0], shapes["topk_ids"]
    if shapes["starts"][0] != n or shapes["kinds"][0] != n or shapes["topk_logp"] != rows:
        raise TeacherDataError(f"{name}: its arrays' sizes disagree ({shapes}): {AGAIN}")
    if not (
        n <= MAX_RECORDS
        and shapes["ids"][0] <= MAX_IDS
        and 1 <= rows[1] <= MAX_K
        and rows[0] * rows[1] <= MAX_TOPK_CELLS
    ):
        raise TeacherDataError(
            f"{name}: declares {n} records, {shapes['ids'][0]} tokens and {rows[0]} x {rows[1]} top-k cells, past what "
            f"a shard may hold ({MAX_RECORDS}, {MAX_IDS}, {MAX_TOPK_CELLS} cells of K <= {MAX_K}): {AGAIN}"
        )
    return shapes


AGAIN = "bring it back again, or generate it again (a damaged, foreign or truncated shard)"


def check_arrays(name: str, a: Mapping[str, np.ndarray], vocab: int | None) -> None:
    """Every record of one shard's arrays is trainable: a length > 0, a start in [1, length), a known kind, ids in
    [0, vocab), log-probs finite and <= 0 whose probabilities sum to at most 1. A refusal names the shard and the
    first bad record (its index in the shard)."""
    lengths, starts = a["lengths"].astype(np.int64), a["starts"].astype(np.int64)

    def bad(index: np.ndarray, what: str) -> None:
        if index.any():
            i = int(np.flatnonzero(index)[0])
            msg = what.format(i=i, length=int(lengths[i]), start=int(starts[i]))
            raise TeacherDataError(f"{name} record {i}: {msg}: {AGAIN}")

    bad(lengths <= 0, "length {length} is not positive")
    bad((starts < 1) | (starts >= lengths), "start {start} is not inside its length {length} (1 <= start < length)")
    bad(a["kinds"] >= len(KINDS), f"kind is not one of {KINDS}")
    answers = lengths - starts
    if int(lengths.sum()) != len(a["ids"]) or int(answers.sum()) != len(a["topk_ids"]):
        raise TeacherDataError(f"{name}: its arrays do not add up (a damaged or truncated shard): {AGAIN}")
    seq_end, row_end = np.cumsum(lengths), np.cumsum(answers)

    def bad_at(positions: np.ndarray | np.bool_, ends: np.ndarray, what: str) -> None:
        if positions.any():
            first = int(np.flatnonzero(positions)[0])
            i = int(np.searchsorted(ends, first, side="right"))
            raise TeacherDataError(f"{name} record {i}: {what}: {AGAIN}")

    top = vocab if vocab is not None else np.iinfo(np.int32).max
    bad_at((a["ids"] < 0) | (a["ids"] >= top), seq_end, f"a token id outside the vocabulary [0, {top})")
    bad_at(((a["topk_ids"] < 0) | (a["topk_ids"] >= top)).any(1), row_end, f"a top-k id outside [0, {top})")
    logp = a["topk_logp"]
    bad_at(~np.isfinite(logp).all(1), row_end, "a log-prob that is NaN or infinite")
    bad_at((logp > 0).any(1), row_end, "a positive log-prob (a probability over 1)")
    probs = logp.astype(np.float32)
    np.exp(probs, out=probs)
    bad_at(probs.sum(1) > 1 + MASS_SLACK, row_end, "top-k probabilities that sum past 1")


def load_shard(path: Path, vocab: int | None = None) -> list[dict]:
    """The records of one shard as dicts (``Record``'s fields; ids int32, log-probs float16), either format, each
    checked (``check_arrays``; ids below ``vocab`` when given). An ``.npz`` is sized from its headers first
    (``npz_shapes``). A shard that fails is a ``TeacherDataError`` naming it, the record and the fix."""
    path = Path(path)
    if path.suffix == ".pt":
        try:
            recs = torch.load(path)
            arrays = {
                "ids": torch.cat([r["ids"] for r in recs]).numpy(),
                "lengths": np.array([len(r["ids"]) for r in recs]),
                "starts": np.array([r["start"] for r in recs]),
                "kinds": np.array([KINDS.index(r["kind"]) if r["kind"] in KINDS else 255 for r in recs]),
                "topk_ids": torch.cat([r["topk_ids"] for r in recs]).numpy(),
                "topk_logp": torch.cat([r["topk_logp"] for r in recs]).numpy(),
            }
        except Exception as err:  # noqa: BLE001 - whatever a damaged pickle raises, the shard is refused by name
            raise TeacherDataError(f"{path.name}: not a readable shard ({type(err).__name__}): {AGAIN}") from None
        check_arrays(path.name, arrays, vocab)
        return recs
    npz_shapes(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in NPZ_ARRAYS}
    check_arrays(path.name, arrays, vocab)
    ids = torch.from_numpy(arrays.pop("ids").astype(np.int32))
    topk_ids = torch.from_numpy(arrays.pop("topk_ids").astype(np.int32))
    topk_logp = torch.from_numpy(arrays["topk_logp"])
    out, a, b = [], 0, 0
    for n, start, kind in zip(arrays["lengths"].tolist(), arrays["starts"].tolist(), arrays["kinds"].tolist()):
        m = n - start
        out.append(
            {
                "ids": ids[a : a + n],
                "start": start,
                "topk_ids": topk_ids[b : b + m],
                "topk_logp": topk_logp[b : b + m],
                "kind": KINDS[kind],
            }
        )
        a, b = a + n, b + m
    return out


def load_records(data_dir: Path, vocab: int | None = None) -> list[dict]:
    """Every record of the shards in ``data_dir`` (``shard_files``), in shard order, each checked (``load_shard``)."""
    recs = []
    for p in shard_files(data_dir):
        recs.extend(load_shard(p, vocab))
    return recs


# --------------------------------------------------------------------------------------------------
# The folder's manifest
# --------------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict | None:
    """``folder``'s manifest (``{"run", "settings", "shards", "wall_s", ...}``), or None where there is none."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise TeacherDataError(f"{path}: not a readable manifest ({err}): bring back its bundles again") from None
    if not isinstance(m, dict) or not isinstance(m.get("settings"), dict) or not isinstance(m.get("shards"), dict):
        raise TeacherDataError(f"{path}: not a teacher-data manifest (settings, shards): bring back its bundles again")
    if any(
        not isinstance(k, str) or not SHARD_NAME.fullmatch(k) or not isinstance(v, dict) for k, v in m["shards"].items()
    ):
        raise TeacherDataError(f"{path}: lists names that are not shard-NNNN.pt/.npz: bring back its bundles again")
    return m


def entry_matches(path: Path, entry: Mapping[str, Any]) -> bool:
    """``path`` is a regular file with the size and SHA-256 its manifest entry records."""
    return (
        path.is_file()
        and not path.is_symlink()
        and path.stat().st_size == entry.get("bytes")
        and file_sha256(path) == entry.get("sha256")
    )


def check_folder(folder: Path, *, load: bool = True) -> dict:
    """A folder of teacher data ready to train on: its manifest lists every shard there and no other, each with its
    size and SHA-256, and (``load``) every record passes ``load_shard`` against the manifest's vocabulary. Returns the
    manifest; a refusal is a ``TeacherDataError`` naming the fix."""
    folder = Path(folder)
    m = read_manifest(folder)
    if m is None:
        raise TeacherDataError(
            f"{folder}: no {MANIFEST} (the list of the generation's shards and settings): unpack the bundles a GPU "
            "node returned (bash jobs/teacher_back.sh <bundles>), or point at the folder a generation wrote"
        )
    listed, present = set(m["shards"]), {p.name for p in shard_files(folder)}
    if not listed:
        raise TeacherDataError(f"{folder}: its manifest lists no shard: generate some first")
    if present - listed:
        raise TeacherDataError(f"{folder}: {sorted(present - listed)[:4]} not in its manifest: move them away")
    missing = sorted(listed - present)
    if missing:
        raise TeacherDataError(
            f"{folder}: {len(missing)} of the manifest's {len(listed)} shards are missing ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}): bring back every bundle (gpu_teacher collect) and unpack them"
        )
    vocab = m["settings"].get("vocab_size")
    for name in sorted(listed):
        if not entry_matches(folder / name, m["shards"][name]):
            raise TeacherDataError(f"{folder / name}: not the shard its manifest lists (size or SHA-256): {AGAIN}")
        if load:
            load_shard(folder / name, vocab)
    return m


def shard_entry(path: Path, records: list[Any], seconds: float) -> dict:
    return {
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        "records": len(records),
        "tokens": sum(len(r.topk_ids) for r in records),
        "seconds": round(seconds, 3),
    }


class ShardFolder:
    """A generation's output folder: its manifest records ``settings`` (a folder made with other ones is refused:
    shards of two settings never mix), each finished shard's entry, and the generation's wall time. A shard is
    done when its file matches its entry; one that does not (damaged, or written just before a kill) is removed and
    generated again."""

    def __init__(self, folder: Path, settings: Mapping[str, Any], log: Callable[[str], None]):
        self.folder, self.log = Path(folder), log
        self.folder.mkdir(parents=True, exist_ok=True)
        for tmp in self.folder.glob(".*.tmp-*"):  # a killed writer's leftovers
            tmp.unlink()
        settings = json.loads(json.dumps(dict(settings)))
        m = read_manifest(self.folder)
        if m is None and shard_files(self.folder):
            raise TeacherDataError(
                f"{self.folder} holds shards but no {MANIFEST} (their settings are unknown): move them away, or "
                "generate into another folder"
            )
        if m is not None and m["settings"] != settings:
            diff = sorted(k for k in set(settings) | set(m["settings"]) if settings.get(k) != m["settings"].get(k))
            was = ", ".join(f"{k}={m['settings'].get(k)!r} (now {settings.get(k)!r})" for k in diff)
            raise TeacherDataError(
                f"{self.folder} was generated with other settings: {was}; generate into another folder "
                "(distill work_dir=, gpu_teacher --work) or with the settings it was made with"
            )
        self.manifest = m or {"run": uuid.uuid4().hex, "settings": settings, "shards": {}, "wall_s": 0.0}
        self.wall0 = float(self.manifest.get("wall_s", 0.0))

    def done(self, name: str) -> bool:
        path, entry = self.folder / name, self.manifest["shards"].get(name)
        if entry is not None and entry_matches(path, entry):
            return True
        if entry is not None or path.exists():
            self.log(
                f"{name}: {'not the file its manifest lists' if entry else 'not in the manifest'}: generated again"
            )
            path.unlink(missing_ok=True)
            self.manifest["shards"].pop(name, None)
        return False

    def longest(self) -> float:
        return max((float(e.get("seconds", 0.0)) for e in self.manifest["shards"].values()), default=0.0)

    def add(self, name: str, records: list[Any], seconds: float, elapsed: float, info: Mapping[str, Any]) -> Path:
        """Write a finished shard, then the manifest that lists it (both atomically)."""
        path = self.folder / name
        save_shard(records, path)
        self.manifest["shards"][name] = shard_entry(path, records, seconds)
        self.manifest["wall_s"] = round(self.wall0 + elapsed, 1)
        self.manifest["info"] = dict(info)
        write_json(self.folder / MANIFEST, self.manifest)
        return path
