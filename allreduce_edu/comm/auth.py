"""Who may talk to a rank: the cluster's shared token on every call, and TLS between machines.

Used by the rank servers and clients (comm/transports/grpc/) and by the rendezvous
(runtime/rendezvous.py).
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

import grpc

log = logging.getLogger("allreduce_edu")

TOKEN_KEY, RANK_KEY = "x-allreduce-token", "x-allreduce-rank"
CHANNEL_OPTIONS = [
    ("grpc.enable_http_proxy", 0),  # loopback traffic must never go through a proxy
    # a peer that refuses the connection (rank 0 still starting, at rendezvous) is dialled again
    # within about a second, not on gRPC's default backoff (1 s, growing 1.6x a try, +-20 %), which
    # dials at about 0, 1, 2.6, 5.2, 9.3, 16, 26 and 43 s: a rank 0 listening at 5 s was asked at
    # 9.8 s. A connect that gets no answer at all (a firewall) still waits 20 s a try, as before.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def channel(address: str, tls: TLS | None = None) -> grpc.Channel:
    """A client channel to `address`: TLS when the cluster has it, never through a proxy."""
    if tls is not None:
        return grpc.secure_channel(address, tls.channel_credentials(), options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


@dataclass(frozen=True)
class TLS:
    """TLS for ranks on several machines: PEM bytes of the cluster's certificate chain and key.

    `ca` verifies peers (defaults to `cert`: a self-signed cluster certificate is its own CA);
    `mutual=True` makes servers demand a client certificate signed by `ca` too.
    """

    cert: bytes
    key: bytes
    ca: bytes | None = None
    mutual: bool = False

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)],
                                           root_certificates=self.ca or self.cert,
                                           require_client_auth=self.mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca or self.cert,
                                            private_key=self.key if self.mutual else None,
                                            certificate_chain=self.cert if self.mutual else None)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuse every call that lacks the cluster's token (declared or not, any call kind)
    with UNAUTHENTICATED."""

    def __init__(self, token: str):
        self._token = token.encode()
        self._warned: set[str] = set()

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata).get(TOKEN_KEY, "")
        if hmac.compare_digest(given.encode() if isinstance(given, str) else given, self._token):
            return continuation(details)
        # once per method, a few methods
        if details.method not in self._warned and len(self._warned) < 16:
            self._warned.add(details.method)
            log.warning("refused a call to %s without the cluster token", details.method)
        return _REFUSE


def _refuse(request_or_iterator, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cluster token")


# A stream-stream handler starts at once, whatever kind of call the client made,
# so nothing is read first.
_REFUSE = grpc.stream_stream_rpc_method_handler(_refuse)
