# Sans-IO wire codecs, one subpackage per protocol (bytes in, frames out; frames in, bytes out): no sockets, no asyncio, no broker state.
