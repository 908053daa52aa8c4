"""One source of truth for tools: a declaration yields the OpenAI schema *and* the validator.

A tool is a plain function ``fn(ws, **args)`` declared with :func:`tool`. The same
``Param`` list generates the JSON schema the agent sees (at SFT time and at rollout
time) and the argument check run before every call, so the two can never drift.
Validation is hand-rolled rather than pydantic because it sits on the hot path of
every episode step (target: a few microseconds per call).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Callable

JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict}
# ASCII digits and \Z (not $, which also matches before a trailing newline).
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")
# seconds and their fraction optional (2026-03-05T14:00, ...T14:00:00.000Z as JavaScript writes it), an offset optional
_DATETIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?([+-][0-9]{2}:[0-9]{2}|Z)?\Z")
# an address as the world's records write one (no display name, brackets or mailto:, which mail clients add around it)
_EMAIL = re.compile(r"[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+\Z")
FORMATS = {"date": _DATE, "date-time": _DATETIME, "email": _EMAIL}


def _format_ok(fmt: str, v: str) -> bool:
    """The shape (regex) and, for dates, a real calendar value (no 2026-02-30, no 25:00)."""
    if not FORMATS[fmt].match(v):
        return False
    try:
        if fmt == "date":
            date.fromisoformat(v)
        elif fmt == "date-time":
            datetime.fromisoformat(v[:-1] + "+00:00" if v.endswith("Z") else v)
    except ValueError:
        return False
    return True


class ToolError(Exception):
    """An error returned to the agent as a tool result (never a Python crash)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"type": self.code, "message": self.message}


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # string | integer | number | boolean | object | array[<item type>]
    description: str
    required: bool = True
    enum: tuple[Any, ...] | None = None
    format: str | None = None  # date | date-time | email (checked, and shown in the schema)
    minimum: float | None = None

    def schema(self) -> dict[str, Any]:
        if self.type.startswith("array["):
            item = self.type[6:-1]
            s: dict[str, Any] = {"type": "array", "items": {"type": item}}
            if self.format:
                s["items"]["format"] = self.format
        else:
            s = {"type": self.type}
            if self.format:
                s["format"] = self.format
        s["description"] = self.description
        if self.enum is not None:
            (s["items"] if self.type.startswith("array[") else s)["enum"] = list(self.enum)
        if self.minimum is not None:
            s["minimum"] = self.minimum
        return s


@dataclass(frozen=True)
class Tool:
    name: str
    service: str
    description: str
    params: tuple[Param, ...]
    fn: Callable[..., Any]
    mutates: bool
    destructive: bool = False
    hidden: bool = False  # system tools: used by world events, never exposed to agents
    _by_name: dict[str, Param] = field(default_factory=dict, compare=False, repr=False)
    # hot-path caches: required names in declaration order; params any str satisfies
    _required: tuple[str, ...] = field(default=(), compare=False, repr=False)
    _plain_str: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    _emails: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.params})
        object.__setattr__(self, "_required", tuple(p.name for p in self.params if p.required))
        object.__setattr__(self, "_plain_str", frozenset(
            p.name for p in self.params if p.type == "string" and p.enum is None and p.format is None))
        object.__setattr__(self, "_emails", tuple(p.name for p in self.params if p.format == "email"))

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.schema() for p in self.params},
                    "required": [p.name for p in self.params if p.required],
                    "additionalProperties": False,
                },
            },
        }

    def validate(self, args: Any) -> dict[str, Any]:
        """Return the checked arguments or raise ToolError('invalid_arguments', ...)."""
        if not isinstance(args, dict):
            raise ToolError("invalid_arguments", f"{self.name}: arguments must be a JSON object, got {type(args).__name__}")
        by_name, plain = self._by_name, self._plain_str
        for key, value in args.items():
            p = by_name.get(key)
            if p is None:
                raise ToolError(
                    "invalid_arguments",
                    f"{self.name}: unknown argument '{key}' (expected: {', '.join(by_name) or 'none'})",
                )
            if value.__class__ is str and key in plain:  # fast path: nothing more to check
                continue
            if value is None and not p.required:
                continue
            _check_value(self.name, p, value)
        for name in self._required:
            if name not in args:
                raise ToolError("invalid_arguments", f"{self.name}: missing required argument '{name}'")
        return _lower_emails(args, self._emails) if self._emails else args


def _lower_emails(args: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Addresses are case-insensitive: store them in lower case, as the world's records are, so
    'Mateo.Smith@Globex.example' reaches the same person (and passes the same checks). The
    caller's dict is never edited (a program's steps are shared between episodes)."""
    out = args
    for name in names:
        v = args.get(name)
        if isinstance(v, str):
            low = v.lower()
        elif isinstance(v, list):
            low = [x.lower() for x in v]
        else:
            continue
        if low != v:
            out = dict(out) if out is args else out
            out[name] = low
    return out


def _check_value(tool: str, p: Param, value: Any) -> None:
    t = p.type
    if t.startswith("array["):
        if not isinstance(value, list):
            one = f" (a list even for one: [{json.dumps(value, ensure_ascii=False)}])" if value.__class__ in (str, int, float) else ""
            raise ToolError("invalid_arguments", f"{tool}: '{p.name}' must be an array, got {_jtype(value)}{one}")
        item = t[6:-1]
        for v in value:
            _check_scalar(tool, p, item, v)
            if p.enum is not None and v not in p.enum:
                raise ToolError("invalid_arguments", f"{tool}: '{p.name}' items must be one of {list(p.enum)}, got {v!r}")
        return
    _check_scalar(tool, p, t, value)
    if p.enum is not None and value not in p.enum:
        raise ToolError("invalid_arguments", f"{tool}: '{p.name}' must be one of {list(p.enum)}, got {value!r}")
    if p.minimum is not None and value < p.minimum:
        raise ToolError("invalid_arguments", f"{tool}: '{p.name}' must be >= {p.minimum}, got {value!r}")


def _check_scalar(tool: str, p: Param, t: str, v: Any) -> None:
    py = JSON_TYPES[t]
    # bool is an int subclass in Python but not a JSON integer/number.
    if not isinstance(v, py) or (t in ("integer", "number") and isinstance(v, bool)):
        raise ToolError("invalid_arguments", f"{tool}: '{p.name}' must be {t}, got {_jtype(v)}{_quoted_hint(t, v)}")
    if t == "number" and isinstance(v, float) and not math.isfinite(v):  # NaN/Infinity are not JSON numbers
        raise ToolError("invalid_arguments", f"{tool}: '{p.name}' must be a finite number, got {v!r}")
    if p.format is not None and t == "string" and not _format_ok(p.format, v):
        raise ToolError("invalid_arguments", f"{tool}: '{p.name}' must be {_FORMAT_SHAPES[p.format]}, got {v!r}{_format_hint(p.format, v)}")


# what each format looks like, said in the error a model reads (so its retry can be right)
_FORMAT_SHAPES = {"date": "a date string, YYYY-MM-DD (2026-03-05)",
                  "date-time": "a date-time string, ISO 8601 (2026-03-05T14:00:00Z, or with an offset: +01:00)",
                  "email": "an email address string, the address alone (name@example.com)"}
_ADDRESS_IN = re.compile(_EMAIL.pattern.removesuffix(r"\Z"))  # the addresses a string holds, whatever is around them


def _format_hint(fmt: str, v: str) -> str:
    # addresses written as mail clients show them ("Ana Ruiz <ana@x.example>", mailto:, several in one string):
    # say what to pass instead
    if fmt != "email":
        return ""
    found = _ADDRESS_IN.findall(v)
    if len(found) > 1:
        return f" (one address per item: {json.dumps(found)})"
    return f" (pass {found[0]!r} alone)" if found and found[0] != v else ""


def _quoted_hint(t: str, v: Any) -> str:
    # a number or a truth value sent as a string ("15200.00", "$1,200", "true"): say what to pass instead
    if not isinstance(v, str):
        return ""
    if t in ("integer", "number"):
        plain = re.sub(r"^[$€£]|[,_\s]|[$€£]$", "", v.strip())
        try:
            n = float(plain)
        except ValueError:
            return ""
        if not math.isfinite(n) or (t == "integer" and not n.is_integer()):
            return ""
        return f" (pass {int(n) if t == 'integer' else n!r} as a JSON number, not a string)"
    if t == "boolean" and v.strip().lower() in ("true", "false"):
        return f" (pass {v.strip().lower()} as a JSON boolean, not a string)"
    return ""


def _jtype(v: Any) -> str:
    for name, py in (("boolean", bool), ("integer", int), ("number", float), ("string", str), ("array", list), ("object", dict)):
        if isinstance(v, py):
            return name
    return "null" if v is None else type(v).__name__


REGISTRY: dict[str, Tool] = {}


def tool(
    service: str,
    description: str,
    *params: Param,
    mutates: bool = False,
    destructive: bool = False,
    hidden: bool = False,
    name: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the tool ``<service>_<fn name>`` (OpenAI names allow [a-zA-Z0-9_-])."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = name or f"{service}_{fn.__name__}"
        if tool_name in REGISTRY:
            raise ValueError(f"duplicate tool name {tool_name}")
        REGISTRY[tool_name] = Tool(tool_name, service, description, tuple(params), fn, mutates or destructive, destructive, hidden)
        return fn

    return deco


def P(name: str, type: str, description: str, required: bool = True, **kw: Any) -> Param:
    if "enum" in kw and kw["enum"] is not None:
        kw["enum"] = tuple(kw["enum"])
    return Param(name, type, description, required, **kw)
