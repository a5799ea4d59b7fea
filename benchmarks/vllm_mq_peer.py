"""vLLM peer for `lab.bench.executor`: the cost of broadcasting a pickled object through vLLM's
shared-memory MessageQueue, the transport of vLLM's multiprocess executor.

Standalone: it must not import `lab`; it runs under the python of the peer venv
(experiments/peer_setup.md), from a directory outside the repository:

    cd "$(mktemp -d)" && $LAB_VLLM_PYTHON /path/to/lab/benchmarks/vllm_mq_peer.py [--json OUT]

Set-up mirrors vLLM's MultiprocExecutor (vllm/v1/executor/multiproc_executor.py):
  * one writer (the "executor") owns a broadcast MessageQueue(n_reader, n_reader,
    max_chunk_bytes=VLLM_MQ_MAX_CHUNK_BYTES_MB MiB (16), max_chunks=10);
  * each reader is a separate *spawned* process (like a worker) that attaches with
    MessageQueue.create_from_handle(handle, rank) and owns its own response
    MessageQueue(1, 1), which the writer attaches to as the single reader.

Per payload kind/size and reader count it measures (all in microseconds):
  pickle   : pickle.dumps + pickle.loads of the message in one process (no transport)
  enqueue  : writer-side time of mq.enqueue(msg) in lock-step mode (what the
             scheduler process pays per broadcast; includes pickling)
  one-way  : from just before enqueue to the moment the *last* reader's dequeue()
             returned the unpickled object (CLOCK_MONOTONIC, comparable across
             processes), lock-step mode
  rtt      : enqueue + every reader dequeues and replies with a tiny ack over its
             response MessageQueue + writer dequeues all acks (vLLM's collective_rpc
             pattern), lock-step mode
  stream   : back-to-back enqueues (ring of 10 chunks gives back-pressure), wall
             time from first enqueue to last reader's last dequeue / n messages
Each lock-step figure is the median over --n timed messages after --warmup messages.
"""

import argparse
import json
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

now_ns = time.perf_counter_ns  # CLOCK_MONOTONIC on Linux: system-wide


def make_payload(kind: str, nbytes: int):
    """Object whose pickle (HIGHEST_PROTOCOL) is about nbytes."""
    if kind == "bytes":
        obj = b"x" * nbytes
        over = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)) - nbytes
        return b"x" * max(0, nbytes - over)
    # "struct": SchedulerOutput-like: request ids, per-request token-id lists,
    # a dict of scheduled-token counts and some floats.
    def build(n_req, n_tok):
        return {
            "req_ids": [f"cmpl-{i:08x}-0" for i in range(n_req)],
            "new_token_ids": [
                [1000 + (7919 * (i * n_tok + j)) % 59000 for j in range(n_tok)]
                for i in range(n_req)
            ],
            "num_scheduled_tokens": {f"cmpl-{i:08x}-0": n_tok for i in range(n_req)},
            "temperature": [0.7] * n_req,
            "total_num_scheduled_tokens": n_req * n_tok,
        }

    n_req = 8
    n_tok = 1
    while len(pickle.dumps(build(n_req, n_tok), protocol=pickle.HIGHEST_PROTOCOL)) < nbytes:
        n_tok += 1
    return build(n_req, n_tok)


def reader_main(rank, bcast_handle, conn):
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    bmq = MessageQueue.create_from_handle(bcast_handle, rank)
    rmq = MessageQueue(1, 1)  # worker -> writer response queue
    conn.send(rmq.export_handle())
    bmq.wait_until_ready()
    rmq.wait_until_ready()
    recv_t = []
    while True:
        msg = bmq.dequeue(indefinite=True)
        t = now_ns()
        tag = msg[0]
        if tag == "L":  # lock-step: record and ack
            recv_t.append(t)
            rmq.enqueue(msg[1])
        elif tag == "S":  # streaming: record only
            recv_t.append(t)
        elif tag == "report":
            rmq.enqueue(recv_t)
            recv_t = []
        elif tag == "stop":
            break


def run_group(n_readers, payloads, n, warmup):
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    ctx = mp.get_context("spawn")
    max_chunk_bytes = int(os.environ.get("VLLM_MQ_MAX_CHUNK_BYTES_MB", "16")) * 1024 * 1024
    bmq = MessageQueue(n_readers, n_readers, max_chunk_bytes=max_chunk_bytes)
    handle = bmq.export_handle()
    procs, conns = [], []
    for r in range(n_readers):
        a, b = ctx.Pipe()
        p = ctx.Process(target=reader_main, args=(r, handle, b), daemon=True)
        p.start()
        procs.append(p)
        conns.append(a)
    resp_handles = [c.recv() for c in conns]
    rmqs = [MessageQueue.create_from_handle(h, 0) for h in resp_handles]
    bmq.wait_until_ready()
    for q in rmqs:
        q.wait_until_ready()

    rows = []
    for kind, nbytes, payload in payloads:
        msg_size = len(pickle.dumps(("L", 0, payload), protocol=pickle.HIGHEST_PROTOCOL))
        # in-process pickle round trip, for reference
        pk = []
        for _ in range(2000):
            t0 = now_ns()
            pickle.loads(pickle.dumps(("L", 0, payload), protocol=pickle.HIGHEST_PROTOCOL))
            pk.append(now_ns() - t0)

        # lock-step
        send_t, enq, rtt = [], [], []
        total = warmup + n
        for i in range(total):
            msg = ("L", i, payload)
            t0 = now_ns()
            bmq.enqueue(msg)
            t1 = now_ns()
            for q in rmqs:
                ack = q.dequeue()
                assert ack == i
            t2 = now_ns()
            send_t.append(t0)
            enq.append(t1 - t0)
            rtt.append(t2 - t0)
        bmq.enqueue(("report",))
        recvs = [q.dequeue() for q in rmqs]
        one_way = [
            max(r[i] for r in recvs) - send_t[i] for i in range(warmup, total)
        ]

        # streaming
        for i in range(warmup):
            bmq.enqueue(("S", i, payload))
        bmq.enqueue(("report",))
        for q in rmqs:
            q.dequeue()
        t_start = now_ns()
        for i in range(n):
            bmq.enqueue(("S", i, payload))
        t_wdone = now_ns()
        bmq.enqueue(("report",))
        recvs = [q.dequeue() for q in rmqs]
        t_last = max(r[-1] for r in recvs)
        stream = (t_last - t_start) / n

        med = lambda xs: statistics.median(xs) / 1e3  # noqa: E731
        rows.append(
            dict(
                kind=kind,
                target=nbytes,
                size=msg_size,
                readers=n_readers,
                pickle=med(pk),
                enqueue=med(enq[warmup:]),
                one_way=med(one_way),
                rtt=med(rtt[warmup:]),
                rtt_p90=sorted(rtt[warmup:])[int(0.9 * n)] / 1e3,
                stream=stream / 1e3,
                stream_w=(t_wdone - t_start) / n / 1e3,
            )
        )
    bmq.enqueue(("stop",))
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2048,40960", help="target pickle sizes, bytes")
    ap.add_argument("--readers", default="1,2")
    ap.add_argument("--kinds", default="bytes,struct")
    ap.add_argument("--n", type=int, default=3000, help="timed messages per cell")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = ap.parse_args()

    import torch
    import vllm

    payloads = [
        (k, int(s), make_payload(k, int(s)))
        for k in args.kinds.split(",")
        for s in args.sizes.split(",")
    ]
    print(
        f"vllm {vllm.__version__}  torch {torch.__version__}  python "
        f"{sys.version.split()[0]}  cpus {os.cpu_count()}  n={args.n} warmup={args.warmup}"
    )
    rows = []
    for nr in [int(x) for x in args.readers.split(",")]:
        rows += run_group(nr, payloads, args.n, args.warmup)

    hdr = (
        f"{'payload':>7} {'bytes':>6} {'rdrs':>4} | {'pickle':>7} {'enqueue':>8} "
        f"{'one-way':>8} {'rtt':>8} {'rtt p90':>8} {'stream':>8} {'strm(w)':>8}"
    )
    print("\nmicroseconds per message (median unless noted)")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['kind']:>7} {r['size']:>6} {r['readers']:>4} | {r['pickle']:7.1f} "
            f"{r['enqueue']:8.1f} {r['one_way']:8.1f} {r['rtt']:8.1f} {r['rtt_p90']:8.1f} "
            f"{r['stream']:8.1f} {r['stream_w']:8.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peer": "vllm", "version": vllm.__version__, "rows": rows}, f)
    print(
        "\npickle=dumps+loads in-process; enqueue=writer-side enqueue(); one-way=before "
        "enqueue -> last reader's dequeue returned; rtt=broadcast + per-reader ack via "
        "response MQs; stream=back-to-back, (last reader done - first send)/n; "
        "strm(w)=writer-side time per enqueue while streaming"
    )


if __name__ == "__main__":
    main()
