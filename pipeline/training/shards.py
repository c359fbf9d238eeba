"""Teacher-data shards on disk: ``shard-XXXX.pt`` (``torch.save`` of the records' dicts) or ``shard-XXXX.npz`` (the
compact arrays a GPU node returns within its 16 MiB files), written by ``teacher_data.generate_teacher_data`` and
read by the distillation (``load_records``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SHARD_FORMATS = ("pt", "npz")
KINDS = ("gen", "gen2", "tf")


def shard_files(data_dir: Path) -> list[Path]:
    """The teacher shards in ``data_dir`` (``shard-XXXX.pt`` and ``shard-XXXX.npz``), in shard order."""
    return sorted(p for fmt in SHARD_FORMATS for p in Path(data_dir).glob(f"shard-*.{fmt}"))


def save_shard(records: list[Any], path: Path) -> None:
    """Write ``records`` (``teacher_data.Record``s) to ``path``: ``.pt`` is ``torch.save`` of their dicts; ``.npz``
    is the compact form (``numpy.savez_compressed``): every record's ids in one array, the top-k rows of all answer
    positions in two ``[N, K]`` arrays, ids as uint16 when the vocabulary fits (49,152 here), log-probs float16.
    At K = 32 that is 128 bytes an answer token (the ``.pt`` form: 192) before zlib."""
    path = Path(path)
    if path.suffix == ".pt":
        torch.save([r.__dict__ for r in records], path)
        return
    if path.suffix != ".npz":
        raise ValueError(f"a shard is .pt or .npz, not {path.name}")
    import numpy as np  # noqa: PLC0415

    if not records:
        raise ValueError(f"{path.name}: no records to write")
    ids = torch.cat([r.ids for r in records])
    topk_ids = torch.cat([r.topk_ids for r in records])
    top = max(int(ids.max()), int(topk_ids.max()))
    id_type = np.uint16 if top < 2**16 else np.int32
    with open(path, "wb") as f:
        np.savez_compressed(
            f,
            ids=ids.numpy().astype(id_type),
            lengths=np.array([len(r.ids) for r in records], dtype=np.int32),
            starts=np.array([r.start for r in records], dtype=np.int32),
            kinds=np.array([KINDS.index(r.kind) for r in records], dtype=np.uint8),
            topk_ids=topk_ids.numpy().astype(id_type),
            topk_logp=torch.cat([r.topk_logp for r in records]).to(torch.float16).numpy(),
        )


def load_shard(path: Path) -> list[dict]:
    """The records of one shard as dicts (``Record``'s fields; ids int32, log-probs float16), either format."""
    path = Path(path)
    if path.suffix == ".pt":
        return torch.load(path)
    import numpy as np  # noqa: PLC0415

    with np.load(path) as z:
        ids = torch.from_numpy(z["ids"].astype(np.int32))
        topk_ids = torch.from_numpy(z["topk_ids"].astype(np.int32))
        topk_logp = torch.from_numpy(z["topk_logp"])
        lengths, starts, kinds = z["lengths"].tolist(), z["starts"].tolist(), z["kinds"].tolist()
    if int(sum(lengths)) != len(ids) or int(sum(n - s for n, s in zip(lengths, starts))) != len(topk_ids):
        raise ValueError(f"{path}: its arrays do not add up (a damaged or truncated shard): bring it back again")
    out, a, b = [], 0, 0
    for n, start, kind in zip(lengths, starts, kinds):
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


def load_records(data_dir: Path) -> list[dict]:
    """Every record of the shards in ``data_dir`` (``shard_files``), in shard order."""
    recs = []
    for p in shard_files(data_dir):
        recs.extend(load_shard(p))
    return recs
