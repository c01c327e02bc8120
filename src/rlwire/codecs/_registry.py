"""Codecs by name, found through the ``rlwire.codecs`` entry point group.

A package adds a codec by registering a factory (usually the codec class) under a name::

    [project.entry-points."rlwire.codecs"]
    mycodec = "mypackage.codec:MyCodec"

and a program can do the same for itself with ``register_codec("mycodec", MyCodec)``.

rlwire's own codecs are registered the same way in its pyproject.toml. The name is
recorded in every message, so a receiver decodes each message with the codec that made
it, looked up here.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

import numpy as np

from rlwire._core.errors import ConfigError, RlwireError
from rlwire._core.plugin_calls import guarded_sliced, is_plugin, plugin_error, wrong_return
from rlwire._core.registry import Registry
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame

__all__ = [
    "GROUP",
    "Check",
    "Codec",
    "RowArrays",
    "available_codecs",
    "encoding",
    "get_codec",
    "make_codec",
    "plugin_codec",
    "register_codec",
]

#: The entry point group codecs register in.
GROUP = "rlwire.codecs"
# Used only when rlwire's own entry points are missing (e.g. run from a source tree).
_BUILTIN = {
    "json": "rlwire.codecs._json.codec:JsonCodec",
    "msgpack": "rlwire.codecs._msgpack.codec:MsgpackCodec",
}


#: What a codec's ``check`` option is: called as ``check(struct, path)`` for each Struct
#: the encoder walks, raising SchemaError to refuse it. rlwire validates its own
#: TrainingSample this way, in the encoding pass. The msgpack codec walks only where a
#: buffer may be (a Struct with array or bytes fields, or one in an ``Any`` field), so a
#: Struct of lists and strings is encoded by msgspec without being shown to ``check``:
#: rlwire.Checks validates any type. A check may also have a ``rows(items, path)``
#: method: for a list it stores as columns, the msgpack codec calls that once instead of
#: ``check`` per item, so that a list of thousands of samples is validated a column at a
#: time. If ``rows`` returns a dict, the codec puts in it, by field name, what it stored
#: for each field as it goes: a :class:`RowArrays` for a field of arrays of one kind,
#: else the list of the items' values; a check may read those rather than each item.
Check: TypeAlias = Callable[[Any, str], None]


class RowArrays(NamedTuple):
    """The arrays of one field of a list of items, as the msgpack codec stored them for
    a check's ``rows`` (see :data:`Check`): every row a numpy array of one dtype, number
    of dimensions and trailing shape, ``arrays`` holding the rows' values back to back
    (each row's own array, or the groups of consecutive rows the codec joined), row
    ``i`` being values ``offsets[i]:offsets[i + 1]`` of their concatenation.

    Example:
        >>> rows = RowArrays([np.arange(5)], np.array([0, 2, 5]))
        >>> rows.arrays[0][rows.offsets[1] : rows.offsets[2]].tolist()
        [2, 3, 4]
    """

    arrays: list[np.ndarray]
    offsets: np.ndarray


@runtime_checkable
class Codec(Protocol):
    """What a codec provides: objects to :class:`~rlwire.Frame` and back.

    A codec may also offer ``decode_sliced(frame, type, *, writable)``, :meth:`decode` as
    a sliced generator; receivers then decode large messages one slice at a time.

    ``encode_sliced`` is a sliced generator (it yields between short slices of work and
    returns the Frame, whose ``codec`` field is the codec's registered ``name``), so the
    sender can run it in worker threads without stalling the event loop. Factories are
    called with keyword options: ``check`` always (a callable or None), and ``sidecar``
    and ``inline_threshold`` when the user passes them; a factory that does not take
    one of them makes ``open_sender`` raise a ConfigError.
    """

    name: str

    def encode_sliced(self, obj: Any) -> Sliced[Frame]: ...

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> Any: ...


_REGISTRY = Registry(
    GROUP,
    label="codec {name!r}",
    unknown="unknown codec {name!r}; installed codecs: {available}",
    builtin=_BUILTIN,
    hints={"json": "pip install 'rlwire[json]'"},
    accepts=callable,
    expected="callable (a codec factory)",
)


def available_codecs() -> list[str]:
    """The names of the registered codecs, sorted: rlwire's own (``json`` even without
    orjson, which making it then asks for), installed plugins' and :func:`register_codec`'s.

    Example:
        >>> {"json", "msgpack"} <= set(available_codecs())
        True
    """
    return _REGISTRY.names()


def get_codec(name: str) -> Callable[..., Codec]:
    """The factory registered under ``name``, imported on first use.

    Raises:
        ConfigError: no codec has that name (the message lists the installed ones), or
            its module cannot be imported (e.g. an optional dependency is missing).
    """
    factory: Callable[..., Codec] = _REGISTRY.load(name)
    return factory


def register_codec(
    name: str, factory: Callable[..., Codec] | str, *, clobber: bool = False
) -> None:
    """Make ``factory`` the codec called ``name`` in this process, as an entry point in
    the ``rlwire.codecs`` group does for every process.

    ``factory`` is the codec class (or any callable taking the codec's keyword options),
    or a ``"module:attr"`` string imported on first use. The factory's codecs must carry
    ``name`` as their ``name``: it is recorded in every message, and receivers look it
    up here to decode it.

    Raises:
        ConfigError: the name is taken (by a built-in, an entry point or an earlier
            call) and ``clobber`` is false, or ``factory`` is not callable.

    Example:
        >>> register_codec("mycodec", "mypackage.codec:MyCodec")  # imported on first use
        >>> "mycodec" in available_codecs()
        True
        >>> register_codec("msgpack", "mypackage:Other")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        rlwire.errors.ConfigError: codec 'msgpack' is already registered (...); ...
    """
    _REGISTRY.register(name, factory, clobber=clobber)


def make_codec(codec: str | Codec, **options: Any) -> Codec:
    """A codec instance: ``codec`` itself, or the factory named ``codec`` called with
    ``options``.

    Raises:
        ConfigError: an unknown name, or an option the codec does not take.

    Example:
        >>> make_codec("msgpack", inline_threshold=0).inline_threshold
        0
    """
    if not isinstance(codec, str):
        if not isinstance(codec, Codec):
            raise ConfigError(f"codec must be a name or a codec object, got {codec!r}")
        given = sorted(k for k, v in options.items() if v is not None and k != "check")
        if given:
            raise ConfigError(
                f"options {', '.join(given)} configure a codec by name; "
                f"pass them to the codec object {codec!r} instead"
            )
        return codec
    factory = get_codec(codec)
    try:
        made = factory(**options)
    except TypeError as exc:
        raise ConfigError(f"codec {codec!r} does not take these options: {exc}") from None
    if not isinstance(made, Codec):
        raise ConfigError(
            f"codec {codec!r}: its factory returned {made!r}, which is not a codec (it needs "
            "name, encode_sliced and decode: rlwire.abc.Codec)"
        )
    return made


def plugin_codec(codec: object) -> str | None:
    """How errors name ``codec`` if it is a plugin's (defined outside rlwire), else None.

    Example:
        >>> plugin_codec(make_codec("msgpack")) is None
        True
    """
    if not is_plugin(codec):
        return None
    cls = type(codec)
    return f"the codec plugin {getattr(codec, 'name', '?')!r} ({cls.__module__}.{cls.__qualname__})"


def encoding(codec: Codec, obj: Any) -> Sliced[Frame]:
    """``codec.encode_sliced(obj)``; for a plugin's codec, what it raises that is not an
    rlwire error becomes a :class:`~rlwire.PluginError` naming it (the original
    chained), as does a result that is not a :class:`~rlwire.Frame`."""
    who = plugin_codec(codec)
    if who is None:
        return (yield from codec.encode_sliced(obj))
    call = "encode_sliced()"
    try:
        slices = codec.encode_sliced(obj)
    except RlwireError:
        raise
    except Exception as exc:
        raise plugin_error(exc, who, call) from exc
    if not isinstance(slices, Generator):
        raise wrong_return(slices, who, call, "a sliced generator", step=None)
    wants = (lambda got: isinstance(got, Frame), "a rlwire.Frame")
    return (yield from guarded_sliced(slices, who, call, returns=wants))
