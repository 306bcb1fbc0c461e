"""Domain errors → gRPC status codes, in one place.

Servicers only translate messages; each method is wrapped with `grpc_errors`, which turns a
`bpfdyno.core.errors.RequestError` raised by a service into the status code of its class,
with the service's message (which says what went wrong and what to do) as the details.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar, cast

import grpc

from bpfdyno.core.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RequestError,
    Unavailable,
)

#: Each domain error class and its status code (a subclass maps like its base).
STATUS_CODES: tuple[tuple[type[RequestError], grpc.StatusCode], ...] = (
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
)


def status_code(e: RequestError) -> grpc.StatusCode:
    """The gRPC status code for a domain error (FAILED_PRECONDITION for an unlisted one)."""
    for cls, code in STATUS_CODES:
        if isinstance(e, cls):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION


async def abort(context: grpc.aio.ServicerContext, e: RequestError) -> NoReturn:
    """End the call with the error's status code and message."""
    await context.abort(status_code(e), str(e))
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


F = TypeVar("F", bound=Callable[..., Any])


def grpc_errors(method: F) -> F:
    """Wrap a servicer method (unary or server-streaming) so domain errors become statuses."""
    if inspect.isasyncgenfunction(method):
        stream = cast(Callable[..., AsyncIterator[Any]], method)

        @functools.wraps(method)
        async def streaming(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in stream(self, request, context):
                    yield item
            except RequestError as e:
                await abort(context, e)

        return cast(F, streaming)
    unary_method = cast(Callable[..., Awaitable[Any]], method)

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await unary_method(self, request, context)
        except RequestError as e:
            await abort(context, e)

    return cast(F, unary)
