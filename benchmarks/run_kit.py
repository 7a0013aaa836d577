"""Carry a stopped run to another machine through the repository: `pack` writes a folder of runs
(for example runs/alfworld-cpu-full: the expert data, each seed's models, checkpoints and
evaluations) into one .tar.xz, `unpack` puts it back where it was, and the run continues from its
last checkpoint as if it had never moved.

Provenance fingerprints a file by its size and modification time (`agentrl.provenance`), so a copy
that changes the times redoes every phase; the kit keeps each file's time to the nanosecond and
its SHA-256, and unpacking restores the one and checks the other. Pack only a stopped run: what a
running one writes meanwhile is not in the kit. Left out: a checkpoint being saved (.tmp-step_*),
a file being written (*.tmp), and whatever `--exclude` names (globs on the path inside the folder).

    python benchmarks/run_kit.py pack runs/alfworld-cpu-full kit.tar.xz --exclude 'seed0/*'
    python benchmarks/run_kit.py unpack kit.tar.xz
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

MANIFEST = "kit.json"


def inside(folder: Path) -> Path:
    """`folder`, which must be relative to the current directory and inside it."""
    if folder.is_absolute() or ".." in folder.parts:
        raise SystemExit(f"{folder}: give a folder inside the current directory, relative to it")
    return folder


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def carried(rel: Path, exclude: list[str]) -> bool:
    """Whether the file at `rel` (inside the packed folder) goes into the kit."""
    if any(part.startswith(".tmp-") for part in rel.parts) or rel.name.endswith(".tmp"):
        return False
    return not any(fnmatch.fnmatch(rel.as_posix(), pattern) for pattern in exclude)


def pack(folder: Path, kit: Path, exclude: list[str]) -> dict:
    """Writes `kit` (under its name only when complete); its manifest."""
    if not inside(folder).is_dir():
        raise SystemExit(f"{folder}: not a folder")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and carried(p.relative_to(folder), exclude))
    manifest = {"folder": folder.as_posix(), "files": {}}
    for path in files:
        stat = path.stat()
        manifest["files"][path.relative_to(folder).as_posix()] = {
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256(path)}
    tmp = kit.with_name(kit.name + ".tmp")
    kit.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tmp, "w:xz", format=tarfile.PAX_FORMAT) as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for path in files:
            tar.add(path, arcname=path.as_posix(), recursive=False)
    os.replace(tmp, kit)
    return manifest


def unpack(kit: Path, force: bool = False) -> dict:
    """Restores the kit's folder (relative to the current directory) with its files' times; refuses
    to write over a folder that holds files unless `force` (then the folder is replaced)."""
    with tarfile.open(kit, "r:xz") as tar:
        manifest = json.load(tar.extractfile(MANIFEST))
        folder = inside(Path(manifest["folder"]))
        if folder.exists() and any(folder.iterdir()):
            if not force:
                raise SystemExit(f"{folder}: exists and is not empty (--force replaces it)")
            shutil.rmtree(folder)
        names = {f"{folder.as_posix()}/{rel}" for rel in manifest["files"]}
        members = [member for member in tar.getmembers() if member.name in names]
        tar.extractall(members=members, filter="data")
    for rel, entry in manifest["files"].items():
        path = folder / rel
        if path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
            raise SystemExit(f"{kit}: {path} does not match the kit's manifest")
        os.utime(path, ns=(entry["mtime_ns"], entry["mtime_ns"]))
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack")
    packing.add_argument("folder", type=Path)
    packing.add_argument("kit", type=Path)
    packing.add_argument("--exclude", action="append", default=[])
    unpacking = commands.add_parser("unpack")
    unpacking.add_argument("kit", type=Path)
    unpacking.add_argument("--force", action="store_true")
    args = parser.parse_args()
    if args.command == "pack":
        manifest = pack(args.folder, args.kit, args.exclude)
        size = sum(entry["size"] for entry in manifest["files"].values())
        print(f"{args.kit}: {len(manifest['files'])} files of {args.folder} ({size / 2**20:.1f} MiB; "
              f"packed {args.kit.stat().st_size / 2**20:.1f} MiB)")
    else:
        manifest = unpack(args.kit, args.force)
        print(f"{manifest['folder']}: {len(manifest['files'])} files restored from {args.kit}")


if __name__ == "__main__":
    main()
