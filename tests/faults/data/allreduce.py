"""A sum all-reduce over the gang's rendezvous, with the standard library only (torch is not needed).

Each rank contributes YARD_JOB_ID. Rank 0 binds 0.0.0.0:MASTER_PORT, as torch.distributed's TCPStore
does (every interface, so the port is taken for every address of the host), accepts WORLD_SIZE - 1
peers, adds their numbers to its own and sends the sum back to each. The other ranks connect to
MASTER_ADDR:MASTER_PORT. Every rank writes the sum it got to $OUT_DIR/allreduce-<job>-<rank>.txt;
rank 0 keeps its store listening until $OUT_DIR/release exists. Every rank exits 0, like a training
script that never checks whom it met: a cross-wired gang shows only as a wrong sum (or as EADDRINUSE
for a rank 0 whose port is held by another gang).
"""

import os
import socket
import sys
import time

addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
job = int(os.environ["YARD_JOB_ID"])
out = os.path.join(os.environ["OUT_DIR"], f"allreduce-{job}-{rank}.txt")


def receive(conn: socket.socket) -> int:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return int(data)


if rank == 0:
    server = socket.socket()
    # As TCPStore: SO_REUSEADDR lets it bind over connections of an earlier store in TIME_WAIT, but on
    # Linux never over a socket that listens on the port now.
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))  # EADDRINUSE here if another gang's rank 0 holds the port
    server.listen(world)
    server.settimeout(60)
    peers = [server.accept()[0] for _ in range(world - 1)]
    total = job + sum(receive(peer) for peer in peers)
    for peer in peers:
        peer.sendall(f"{total}\n".encode())
        peer.close()
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(4)
            time.sleep(0.2)
    conn.settimeout(60)
    conn.sendall(f"{job}\n".encode())
    total = receive(conn)
with open(out, "w") as f:
    f.write(f"{total}\n")
print(f"rank {rank} of job {job} at {addr}:{port}: sum {total}", flush=True)
if rank == 0:
    # A store lives as long as its job: hold the port until the test says every gang has reduced
    # ($OUT_DIR/release), so that the gangs overlap in time however their processes are scheduled.
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(os.environ["OUT_DIR"], "release")) and time.monotonic() < deadline:
        time.sleep(0.1)
    server.close()
