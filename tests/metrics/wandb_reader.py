"""Read an offline W&B run back from its `.wandb` file (test helper).

The file is a LevelDB-style log of `wandb.proto.wandb_internal_pb2.Record` protobufs: a 7-byte
header (b":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each chunk
`crc32: u32 | length: u16 | type: u8 (1 full, 2 first, 3 middle, 4 last) | data`, with a block's
tail shorter than a chunk header zero-padded. wandb >= 0.2x no longer ships a Python reader
(`wandb.sdk.internal.datastore` is gone in 0.31.0, the version these tests run against), so this
is a small one; the Record schema is wandb's own.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_payloads(path: Path) -> list[bytes]:
    """Every record's serialized bytes, in order (checksums verified)."""
    raw = Path(path).read_bytes()
    ident, magic, version = HEADER.unpack_from(raw, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a .wandb file"
    pos, out, parts = HEADER.size, [], []
    while pos + CHUNK.size <= len(raw):
        if BLOCK - pos % BLOCK < CHUNK.size:  # block trailer
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = CHUNK.unpack_from(raw, pos)
        data = raw[pos + CHUNK.size: pos + CHUNK.size + length]
        if len(data) < length:  # a chunk still being written
            break
        assert zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, "bad checksum"
        pos += CHUNK.size + length
        parts.append(data)
        if kind in (FULL, LAST):
            out.append(b"".join(parts))
            parts = []
    return out


@dataclass
class OfflineRun:
    complete: bool = False  # the `exit` record was read (wandb writes the file asynchronously)
    run: Any = None  # RunRecord (tags, group, display_name, ...)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)  # name -> MetricRecord
    summary: dict[str, Any] = field(default_factory=dict)


def read_run(path: Path, wait_s: float = 60.0) -> OfflineRun:
    """The run record, config, history rows, metric definitions and summary of a .wandb file,
    waiting up to `wait_s` for wandb's service to write the closing `exit` record."""
    deadline = time.monotonic() + wait_s
    while True:
        run = _parse(path)
        if run.complete or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def _parse(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    run = OfflineRun()
    for payload in read_payloads(path):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.run = rec.run
            _update(run.config, rec.run.config.update)
        elif kind == "config":
            _update(run.config, rec.config.update)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "metric":
            run.metrics[rec.metric.name or rec.metric.glob_name] = rec.metric
        elif kind == "summary":
            _update(run.summary, rec.summary.update)
        elif kind == "exit":
            run.complete = True
    return run


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _update(target: dict[str, Any], items) -> None:
    for item in items:
        target[_key(item)] = json.loads(item.value_json)


def find_run_file(run_dir: Path) -> Path:
    """The single `run-*.wandb` file under `<run_dir>/wandb/offline-run-*/`."""
    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"expected one offline run under {run_dir}, found {files}"
    return files[0]
