"""ctypes types as plain data, so a map's key and value types cross a process boundary.

The compile helper (`bpfdyno.ebpf.compilehelper`) gets bcc's ctypes types for every map and
ring buffer record; `describe` turns one into JSON-able data and `build` makes an equal type
again in the daemon, which never imports bcc. Structures keep their field names, bit fields,
packing and anonymous members, so code reading ``value.tgid`` works unchanged.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: The scalar ctypes types by their type code (``c_uint64._type_`` is ``"Q"``...).
_SCALARS: dict[str, type[Any]] = {
    t._type_: t
    for t in (
        ctypes.c_char,
        ctypes.c_byte,
        ctypes.c_ubyte,
        ctypes.c_short,
        ctypes.c_ushort,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_long,
        ctypes.c_ulong,
        ctypes.c_longlong,
        ctypes.c_ulonglong,
        ctypes.c_bool,
        ctypes.c_float,
        ctypes.c_double,
        ctypes.c_char_p,
        ctypes.c_void_p,
    )
}


def describe(t: type[Any]) -> Any:
    """JSON-able data that `build` turns back into a type equal to ``t``.

    Raises:
        TypeError: ``t`` is not a scalar, array, structure or union ctypes type.
    """
    if isinstance(t, type) and issubclass(t, (ctypes.Structure, ctypes.Union)):
        fields = []
        for field in t._fields_:
            name, ftype = field[0], field[1]
            fields.append([name, describe(ftype), *field[2:]])
        return {
            "kind": "union" if issubclass(t, ctypes.Union) else "struct",
            "name": t.__name__,
            "pack": int(getattr(t, "_pack_", 0)),
            "anonymous": list(getattr(t, "_anonymous_", [])),
            "fields": fields,
        }
    if isinstance(t, type) and issubclass(t, ctypes.Array):
        array: Any = t
        return {"kind": "array", "of": describe(array._type_), "length": int(array._length_)}
    code = getattr(t, "_type_", None)
    if isinstance(code, str) and _SCALARS.get(code) is t:
        return {"kind": "scalar", "code": code}
    raise TypeError(f"cannot describe the ctypes type {t!r}")


def build(desc: Any) -> type[Any]:
    """The ctypes type `describe` described.

    Raises:
        ValueError: ``desc`` is not a description `describe` makes.
    """
    try:
        kind = desc["kind"]
        if kind == "scalar":
            return _SCALARS[desc["code"]]
        if kind == "array":
            return build(desc["of"]) * int(desc["length"])  # type: ignore[no-any-return]
        if kind in ("struct", "union"):
            base: type[Any] = ctypes.Union if kind == "union" else ctypes.Structure
            namespace: dict[str, Any] = {}
            if desc["pack"]:
                namespace["_pack_"] = int(desc["pack"])
            if desc["anonymous"]:
                namespace["_anonymous_"] = list(desc["anonymous"])
            namespace["_fields_"] = [
                (str(f[0]), build(f[1]), *(int(b) for b in f[2:])) for f in desc["fields"]
            ]
            return type(str(desc["name"]), (base,), namespace)
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"not a ctypes type description: {desc!r} ({e})") from e
    raise ValueError(f"not a ctypes type description: {desc!r} (kind {kind!r})")
