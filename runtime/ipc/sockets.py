"""zmq plumbing shared by the server's processes: socket paths in a private directory, socket
constructors, and dying with the parent."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq

from radixlm.runtime.ipc.parent_death import set_parent_death_signal


@dataclass(frozen=True)
class IpcPaths:
    """ipc:// endpoints, each bound by the process that PULLs from it."""

    root: str
    scheduler: str
    detokenizer: str
    tokenizer_manager: str

    @classmethod
    def create(cls) -> IpcPaths:
        root = tempfile.mkdtemp(prefix="radixlm-ipc-")  # mode 0700: only the owner can reach the sockets
        os.chmod(root, 0o700)
        return cls(
            root=root,
            scheduler=f"ipc://{root}/scheduler",
            detokenizer=f"ipc://{root}/detokenizer",
            tokenizer_manager=f"ipc://{root}/tokenizer_manager",
        )

    def scheduler_for_rank(self, dp_rank: int) -> str:
        """The endpoint data-parallel rank `dp_rank`'s scheduler PULLs from (rank 0: `scheduler`)."""
        return self.scheduler if dp_rank == 0 else f"{self.scheduler}-dp{dp_rank}"

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def exists(self) -> bool:
        return Path(self.root).exists()


def pull_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    return sock


def push_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def exit_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (so children never outlive it),
    and make SIGTERM / SIGINT exit quietly."""
    set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches the whole group
