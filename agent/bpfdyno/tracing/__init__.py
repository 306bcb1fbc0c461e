"""On-demand PyTorch (Kineto) tracing: the IPC endpoint trainers poll, the trainer registry,
trace requests and their tracking.

Everything here runs on the daemon's single asyncio loop; `TracingComponent` is the part the
daemon starts and stops; `bpfdyno.services.tracing.TracingService` is the transport-free
façade the gRPC servicer, the legacy RPC and the CLI share.
"""
