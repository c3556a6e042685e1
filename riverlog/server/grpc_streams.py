# The two streaming RPCs of the Liftbridge gRPC door: Subscribe (server streaming,
# grpc_subscribe.py) and PublishAsync (bidirectional, grpc_publish_async.py, with the answers
# Publish shares). This file only re-exports their public names, for the import path they had.
from __future__ import annotations

from .grpc_publish_async import AckTemplate, publish_async
from .grpc_subscribe import subscribe

__all__ = ["AckTemplate", "publish_async", "subscribe"]
