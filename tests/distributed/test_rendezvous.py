"""The distributed tests' process groups meet at a port that no other process can take first (see
:func:`tests.distributed.workers.hosted_group`); every multi-process test forms its group this way."""

from __future__ import annotations

import errno
import socket

import pytest

from tests.distributed import workers


@pytest.mark.parametrize("reuse_address", [False, True])
def test_the_group_port_is_held_from_the_moment_it_is_handed_out(reuse_address: bool) -> None:
    with workers.hosted_group() as group:
        port = int(group["MASTER_PORT"])
        assert group["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the ranks join as clients: none binds it later
        with socket.socket() as other:
            if reuse_address:  # as a TCPStore of another run binds
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError) as taken:
                other.bind(("127.0.0.1", port))
        assert taken.value.errno == errno.EADDRINUSE
