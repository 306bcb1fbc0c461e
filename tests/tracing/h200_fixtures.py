"""The real CUDA traces from a GPU node (fixtures/h200), Kineto's own bytes in them, and a
synthetic CUDA-shaped trace of any size built from them."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

FIXTURES = Path(__file__).with_name("fixtures") / "h200"
ITERATIONS = FIXTURES / "cuda_iterations_merged.pt.trace.json.gz"
DURATION = FIXTURES / "cuda_duration_merged.pt.trace.json.gz"
SPAN = b'"PyTorch Profiler (0)"'


@functools.cache
def merged(path: Path) -> bytes:
    """The merged file's JSON (Kineto's bytes with bpfdyno's events inserted)."""
    return gzip.decompress(path.read_bytes())


@functools.cache
def kineto_body(path: Path) -> bytes:
    """Kineto's own file: the merged one without the block bpfdyno inserted before the
    closing ``]`` of ``traceEvents`` (it begins with bpfdyno's first row's metadata)."""
    data = merged(path)
    first = data.index(b'"tid":1000000001')
    start = data.rindex(b",\n{", 0, first)
    close = data.rindex(b"]")
    return data[:start] + data[close:]


def cuda_shaped(size: int) -> tuple[bytes, bytes, bytes, int]:
    """The parts of a CUDA-shaped trace of about ``size`` bytes: (everything up to the
    profiler's span, the span and the GPU activities after it up to the closing ``]``, the
    end), and how many times Kineto's CPU part and GPU part are each repeated.

    Kineto writes the CPU ops, then the span, then the GPU activities; this repeats the real
    file's CPU part and its GPU part as often as it takes (same events again, same times), then
    adds bpfdyno's events of the merged file, so every count is a multiple of the real one's.
    """
    body = kineto_body(DURATION)
    data = merged(DURATION)
    head_end = body.index(b'"traceEvents": [') + len(b'"traceEvents": [')
    span_at = body.rindex(b"\n  {", 0, body.index(SPAN))  # where the span's event begins
    close = body.rindex(b"]")
    cpu = body[head_end:span_at].strip().rstrip(b",")
    gpu = body[span_at:close].strip()
    gpu_only = gpu[gpu.index(b"},", gpu.index(SPAN)) + 2 :].strip()
    span = gpu[: gpu.index(b"},", gpu.index(SPAN)) + 1]
    bpf = data[data.rindex(b",\n{", 0, data.index(b'"tid":1000000001')) : data.rindex(b"]")]
    repeat = max(1, size // (len(cpu) + len(gpu_only)))
    head = body[:head_end] + b"\n" + b",\n".join([cpu] * repeat) + b",\n"
    middle = span + b",\n" + b",\n".join([gpu_only] * repeat) + bpf + b"\n"
    return head, middle, body[close:], repeat
