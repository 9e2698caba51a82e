"""Decode pickles of plain containers without executing anything.

Flight-recorder dumps are pickles, and a run folder is untrusted input: `pickle.load` on it would run
whatever code the file names. This decoder walks the opcode stream with `pickletools.genops` (pure
parsing) and builds only None, bools, numbers, strings, bytes, lists, tuples, dicts and sets. The
only callables it accepts are the list/type-tag builders that PyTorch's C++ pickler emits, mapped to
our own pure functions; anything else — a class, a function, an object to build — is refused.
"""

from __future__ import annotations

import pickletools
from collections.abc import Callable
from typing import Any

MAX_PICKLE_BYTES = 512 * 1024 * 1024


class UnsafePickle(ValueError):
    """The pickle asks for something other than plain containers."""


def _first_argument(*args: Any) -> Any:
    return args[0] if args else None


# torch's C++ pickler (torch/csrc/jit/serialization/pickler.cpp) wraps typed lists and dicts in these.
_ALLOWED_CALLABLES: dict[str, Callable[..., Any]] = {
    "torch.jit._pickle build_intlist": _first_argument,
    "torch.jit._pickle build_doublelist": _first_argument,
    "torch.jit._pickle build_boollist": _first_argument,
    "torch.jit._pickle build_stringlist": _first_argument,
    "torch.jit._pickle build_list": _first_argument,
    "torch.jit._pickle restore_type_tag": _first_argument,
    "builtins set": lambda items=(): set(items),
    "builtins frozenset": lambda items=(): frozenset(items),
    "__builtin__ set": lambda items=(): set(items),
    # protocols 0-2 write bytes as _codecs.encode(text, "latin1"); only that pure re-encoding is allowed
    "_codecs encode": lambda text="", encoding="latin1": _latin1_bytes(text, encoding),
}


def _latin1_bytes(text: Any, encoding: Any) -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickle("_codecs.encode is only decoded for latin-1 text")
    return text.encode("latin-1")


class _Callable:
    def __init__(self, name: str):
        self.name = name


class _Mark:
    pass


_MARK = _Mark()
_SCALAR_OPS = {
    "INT",
    "BININT",
    "BININT1",
    "BININT2",
    "LONG",
    "LONG1",
    "LONG4",
    "FLOAT",
    "BINFLOAT",
    "UNICODE",
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "BINUNICODE8",
    "BINBYTES",
    "SHORT_BINBYTES",
    "BINBYTES8",
}


def _pop_to_mark(stack: list[Any]) -> list[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise UnsafePickle("MARK expected")


def _int_arg(op: str, arg: Any) -> Any:
    if op == "INT" and arg in (True, False):
        return bool(arg)
    return arg


def loads_plain(data: bytes) -> Any:
    """The value a pickle of plain containers holds; raises UnsafePickle for anything else."""
    if len(data) > MAX_PICKLE_BYTES:
        raise UnsafePickle(f"pickle larger than {MAX_PICKLE_BYTES // 2**20} MiB")
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    try:
        for opcode, arg, _pos in pickletools.genops(data):
            op = opcode.name
            if op in ("PROTO", "FRAME"):
                continue
            if op == "STOP":
                return stack.pop()
            if op in _SCALAR_OPS:
                stack.append(_int_arg(op, arg))
            elif op in ("STRING", "BINSTRING", "SHORT_BINSTRING"):
                stack.append(arg if isinstance(arg, str) else bytes(arg).decode("latin-1"))
            elif op == "BYTEARRAY8":
                stack.append(bytearray(arg))
            elif op == "NONE":
                stack.append(None)
            elif op in ("NEWTRUE", "NEWFALSE"):
                stack.append(op == "NEWTRUE")
            elif op == "MARK":
                stack.append(_MARK)
            elif op == "POP":
                stack.pop()
            elif op == "POP_MARK":
                _pop_to_mark(stack)
            elif op == "DUP":
                stack.append(stack[-1])
            elif op == "EMPTY_LIST":
                stack.append([])
            elif op == "APPEND":
                value = stack.pop()
                stack[-1].append(value)
            elif op == "APPENDS":
                items = _pop_to_mark(stack)
                stack[-1].extend(items)
            elif op == "LIST":
                stack.append(_pop_to_mark(stack))
            elif op == "EMPTY_TUPLE":
                stack.append(())
            elif op == "TUPLE":
                stack.append(tuple(_pop_to_mark(stack)))
            elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(op[-1])
                items = stack[-n:]
                del stack[-n:]
                stack.append(tuple(items))
            elif op == "EMPTY_DICT":
                stack.append({})
            elif op == "DICT":
                items = _pop_to_mark(stack)
                stack.append(dict(zip(items[::2], items[1::2], strict=True)))
            elif op == "SETITEM":
                value = stack.pop()
                key = stack.pop()
                stack[-1][key] = value
            elif op == "SETITEMS":
                items = _pop_to_mark(stack)
                stack[-1].update(zip(items[::2], items[1::2], strict=True))
            elif op == "EMPTY_SET":
                stack.append(set())
            elif op == "ADDITEMS":
                items = _pop_to_mark(stack)
                stack[-1].update(items)
            elif op == "FROZENSET":
                stack.append(frozenset(_pop_to_mark(stack)))
            elif op in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif op == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif op in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif op == "GLOBAL":
                name = arg.replace("\n", " ") if isinstance(arg, str) else str(arg)
                stack.append(_named_callable(name))
            elif op == "STACK_GLOBAL":
                attr = stack.pop()
                module = stack.pop()
                stack.append(_named_callable(f"{module} {attr}"))
            elif op == "REDUCE":
                args = stack.pop()
                func = stack.pop()
                if not isinstance(func, _Callable) or not isinstance(args, tuple):
                    raise UnsafePickle("REDUCE on something other than an allowed builder")
                stack.append(_ALLOWED_CALLABLES[func.name](*args))
            else:
                raise UnsafePickle(f"opcode {op} is not allowed (it would build or call objects)")
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, UnsafePickle):
            raise
        raise UnsafePickle(f"damaged pickle: {type(exc).__name__}: {exc}") from exc
    raise UnsafePickle("pickle ended without STOP")


def _named_callable(name: str) -> _Callable:
    if name not in _ALLOWED_CALLABLES:
        raise UnsafePickle(f"refusing to load {name!r}: only plain containers are decoded")
    return _Callable(name)
