# Sans-IO Liftbridge protocol layer, shared by the NATS and gRPC front doors: api.proto (riverlog's
# own, wire-compatible copy of Liftbridge's schema: package `proto`, service `API`, plus the
# internal envelope messages), api_pb2 / api_pb2_grpc generated from it at build/install time
# (setup.py; not committed), envelope.py, the NATS envelope codec, and messages.py, stored
# records as the serialized Messages a Subscribe sends. No sockets, no asyncio.
