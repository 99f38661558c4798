# Runs inside the guest. Imports nothing from the host packages.
"""Records and MISSING: the leaf every other guest module builds on (it imports none of
them), so that typed values (``_typed``), the wire codec (``_codec``) and tool calls
(``tools``, which re-exports these names) form no import cycle."""

import reprlib as _reprlib

__all__ = ["MISSING", "Record", "define_record", "make_record"]


# ---- MISSING ---------------------------------------------------------------------------------
class _Missing:
    """A value that was not given: an argument left to the host's default, a record field
    the host did not send. Falsy; arguments equal to MISSING are not sent. Its repr is
    ``...`` so that a stub's signature reads ``days: int = ...`` (docs/abi.md, Layer 4)."""

    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = object.__new__(cls)
        return cls._instance

    def __repr__(self):
        return "..."

    def __bool__(self):
        return False

    def __reduce__(self):
        return "MISSING"


MISSING = _Missing()


# ---- records ---------------------------------------------------------------------------------
_REGISTRY = {}


class Record:
    """An attribute-accessible value built from a host record (pydantic model, dataclass):
    ext type 5, ``[type_name, {field: value}]``.

    Subclasses list their fields in ``__fields__`` (names, in order) and are registered by
    class name (or ``__type_name__``): a record of that type name from the host becomes an
    instance of the subclass. A type name with no class gives a plain ``Record`` that carries
    the name. Records are mutable, compare equal by type name and fields, and ``to_dict()``
    turns them (recursively) into plain dicts; a record passed as a tool argument is sent as
    that dict.
    """

    __slots__ = ("__dict__", "_memex_type")
    __fields__ = ()
    __type_name__ = "Record"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fields = cls.__dict__.get("__fields__")
        if fields is not None:
            if isinstance(fields, str):
                fields = fields.replace(",", " ").split()
            cls.__fields__ = tuple(fields)
        name = cls.__dict__.get("__type_name__") or cls.__name__
        cls.__type_name__ = name
        _REGISTRY[name] = cls

    def __init__(self, *args, **kwargs):
        fields = type(self).__fields__
        if len(args) > len(fields):
            raise TypeError("%s takes at most %d positional fields (%d given)"
                            % (self._type_name(), len(fields), len(args)))
        d = self.__dict__
        for name, value in zip(fields, args, strict=False):
            if name in kwargs:
                raise TypeError("%s got field %r twice" % (self._type_name(), name))
            d[name] = value
        for name in fields[len(args):]:
            d[name] = kwargs.pop(name, MISSING)
        d.update(kwargs)

    def _type_name(self):
        try:
            return self._memex_type
        except AttributeError:
            return type(self).__type_name__

    @property
    def __record_type__(self):
        """The record's type name (the host's model name)."""
        return self._type_name()

    def to_dict(self):
        """The fields as a plain dict (nested records, lists, tuples and dicts converted
        recursively; fields that are MISSING are left out)."""
        return {k: _plain(v) for k, v in self.__dict__.items() if v is not MISSING}

    def __getitem__(self, name):
        try:
            return self.__dict__[name]
        except KeyError:
            raise KeyError(name) from None

    def __contains__(self, name):
        return name in self.__dict__

    @_reprlib.recursive_repr()
    def __repr__(self):
        parts = []
        for k, v in self.__dict__.items():
            if k.isidentifier():
                parts.append("%s=%r" % (k, v))
            else:
                parts.append("**{%r: %r}" % (k, v))
        return "%s(%s)" % (self._type_name(), ", ".join(parts))

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        if self._type_name() != other._type_name():
            return False
        a, b = self.__dict__, other.__dict__
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)

    __hash__ = None

    def __reduce__(self):
        return make_record, (self._type_name(), dict(self.__dict__))


def _same(a, b):
    # == that also works for fields holding arrays or frames (elementwise results)
    if a is b:
        return True
    try:
        r = a == b
        if r is True or r is False:
            return r
        if type(a) is not type(b):
            return False
        equals = getattr(a, "equals", None)  # pandas objects
        if equals is not None:
            return bool(equals(b))
        shape = getattr(a, "shape", None)
        if shape is not None and shape != getattr(b, "shape", None):
            return False
        all_ = getattr(r, "all", None)
        return bool(all_()) if all_ is not None else bool(r)
    except Exception:
        return False


def _plain(v):
    if isinstance(v, Record):
        return v.to_dict()
    t = type(v)
    if t is list:
        return [_plain(x) for x in v]
    if t is tuple:
        return tuple(_plain(x) for x in v)
    if t is dict:
        return {k: _plain(x) for k, x in v.items()}
    return v


def make_record(type_name, fields):
    """The record of ``type_name`` with ``fields``: an instance of the registered class (no
    ``__init__`` call; declared fields the host did not send are MISSING), else a plain
    ``Record`` carrying the type name."""
    cls = _REGISTRY.get(type_name)
    if cls is None:
        obj = Record.__new__(Record)
        obj._memex_type = type_name
        obj.__dict__.update(fields)
        return obj
    obj = cls.__new__(cls)
    d = obj.__dict__
    for name in cls.__fields__:
        d[name] = fields.get(name, MISSING)
    if len(d) != len(fields) or not all(k in d for k in fields):
        d.update(fields)
    return obj


def define_record(name, fields, doc=None, module=None):
    """Create (and register) a Record subclass ``name`` with ``fields`` (a sequence of
    names or a space/comma separated string)."""
    ns = {"__fields__": fields, "__slots__": ()}
    if doc is not None:
        ns["__doc__"] = doc
    if module is not None:
        ns["__module__"] = module
    return type(name, (Record,), ns)
