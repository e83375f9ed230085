"""Values crossing from the program's process to the judge: builtin types only, tagged so
tuples, sets, bytes and non-string keys survive JSON (standard library only; the harness
imports it before any model code)."""

SCALARS = {type(None): "n", bool: "b", int: "i", str: "s"}


def encode(value, depth=0):
    """A value of builtin types only, tagged so tuples, sets, bytes and non-string keys survive
    JSON; anything else (a subclass, an object of the program's own class) is refused."""
    kind = type(value)
    if depth > 100:
        raise ValueError("value nested more than 100 deep")
    if kind in SCALARS:
        return [SCALARS[kind], value]
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", repr(value.real), repr(value.imag)]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        return [CONTAINERS[kind], [encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"a {kind.__qualname__} is not plain data (builtin types only)")


CONTAINERS = {list: "l", tuple: "t", set: "S", frozenset: "F"}
BUILD = {"l": list, "t": tuple, "S": set, "F": frozenset}


def decode(data):
    """The judge's side of ``encode``: whatever the program sent, only builtin objects come out."""
    tag = data[0]
    if tag == "n":
        return None
    if tag in ("b", "i", "s"):
        expected = {"b": bool, "i": int, "s": str}[tag]
        if type(data[1]) is not expected:
            raise ValueError(f"tag {tag} holds a {type(data[1]).__name__}")
        return data[1]
    if tag == "f":
        return float(data[1])
    if tag == "c":
        return complex(float(data[1]), float(data[2]))
    if tag == "y":
        return bytes.fromhex(data[1])
    if tag in BUILD:
        return BUILD[tag](decode(item) for item in data[1])
    if tag == "d":
        return {decode(k): decode(v) for k, v in data[1]}
    raise ValueError(f"unknown tag {tag!r}")
