"""checkpoint.remote's upload against plain boto3 uploads of the same files, to a real S3 server on loopback.

    python bench/s3_upload.py [--ranks 2] [--mb-per-rank 256]

A fake committed step (each rank's shard of ``--mb-per-rank`` MB, its rank
file, rank 0's small files) is uploaded twice to versitygw (the test suite's
S3 server): once with ``upload_file`` per file, 4 at a time (what
``aws s3 cp --recursive`` does), the reference; once through the remote tier
(``RemoteTier``: hard-link staging, SHA-256 of every file, the part lists, the
manifest by rank 0), one tier per rank as in a training. Printed: MB/s of
each, their ratio, and the commit lag (the seconds from the step's enqueue to
its manifest), which is what the training waits for at its end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fsdp_localcluster.s3 import S3Server
from fsdp_trainer.checkpoint.layout import step_dir_name
from fsdp_trainer.checkpoint.remote import RemoteTier


def fake_step(root: Path, step: int, ranks: int, mb: int) -> Path:
    ckpt = root / step_dir_name(step)
    (ckpt / "ranks").mkdir(parents=True)
    block = os.urandom(1 << 20)
    for rank in range(ranks):
        with open(ckpt / f"__{rank}_0.distcp", "wb") as f:
            for _ in range(mb):
                f.write(block)
        (ckpt / "ranks" / f"rank-{rank:05d}.pt").write_bytes(os.urandom(4096))
    for name in (".metadata", "trainer_config.yaml", "COMPLETE"):
        (ckpt / name).write_bytes(os.urandom(2048))
    return ckpt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mb-per-rank", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        root = Path(tmp)
        server = S3Server(root / "s3").start()
        try:
            os.environ.update(server.env())
            server.create_bucket("bench")
            local = root / "ckpt"
            ckpt = fake_step(local, 1, args.ranks, args.mb_per_rank)
            files = sorted(p for p in ckpt.rglob("*") if p.is_file())
            total = sum(p.stat().st_size for p in files) / 1e6

            s3 = server.client()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda p: s3.upload_file(str(p), "bench", f"plain/{p.relative_to(ckpt)}"), files))
            plain = time.perf_counter() - t0

            tiers = [RemoteTier("s3://bench/tier", 3, local, rank, args.ranks) for rank in range(args.ranks)]
            t0 = time.perf_counter()
            for tier in tiers:
                tier.enqueue(1, ckpt, wrote=True)
            closers = [threading.Thread(target=tier.close, args=(600.0,)) for tier in tiers]
            for c in closers:
                c.start()
            for c in closers:
                c.join()
            lag = time.perf_counter() - t0
            assert tiers[0].stats.committed_step == 1, "the step was not committed"
        finally:
            server.stop()
    print(f"step of {total:.0f} MB ({args.ranks} ranks x {args.mb_per_rank} MB + small files), loopback versitygw")
    print(f"  plain boto3 upload_file, 4 at a time: {plain:6.2f} s  {total / plain:7.1f} MB/s")
    print(f"  checkpoint.remote (stage, SHA-256, parts, manifest): {lag:6.2f} s  {total / lag:7.1f} MB/s")
    print(f"  ratio (remote tier / plain): {plain / lag:.2f} of the plain throughput; commit lag {lag:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
