"""The Kineto IPC endpoint trainers poll: datagram format, socket, replies."""
