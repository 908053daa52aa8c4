"""Fast sandbox for untrusted checker code.

Checker code (Python source defining ``def check(ev): ...``) may be written by an
LLM, so it is treated as hostile.  It runs in a pool of persistent worker
processes; each request is a *batch* (several sources x several arguments) so the
per-call cost is tens of microseconds instead of a process spawn per call.

Isolation layers (defence in depth; each is cheap, none is trusted alone)
--------------------------------------------------------------------------
1. Static AST policy (``static_check``, parent side, cached per source text):
   rejects imports outside ``ALLOWED_MODULES``, every dunder name/attribute
   (``__class__``, ``__globals__``, ``__builtins__``, ``__import__``...) except a
   few harmless reads (``__name__``, ``__init__``...), frame/code/generator
   introspection attributes (``gi_frame``, ``f_back``, ``tb_frame``, ``mro``...)
   and calls to eval/exec/compile/open/getattr/setattr/... -> ``forbidden``.
2. Restricted runtime: code is exec'd with a curated ``__builtins__`` (no open,
   eval, getattr, vars...; ``print`` discards; ``__import__`` only hands out
   read-only *proxies* of allowlisted modules that expose public names only).
   String-to-attribute helpers (``operator.attrgetter/methodcaller``,
   ``hasattr``) refuse dunder and introspection names; ``string.Formatter`` is not
   exposed (its ``get_field`` walks attributes by string).  Python classes reachable
   from the exposed modules are made immutable (``Py_TPFLAGS_IMMUTABLETYPE``) so a
   checker cannot monkeypatch e.g. ``json.JSONDecoder.decode`` for later checkers.
   Every call gets fresh globals, a fresh builtins dict and a reset ``decimal``
   context, so calls cannot leak state into each other through them.  Arguments
   travel as one pickle per request and are decoded once; a call whose compiled
   code provably cannot write to plain data (no subscript/attribute stores or
   deletes, no in-place operators, no mutating method or ``operator`` helper
   names, no dunder names: ``_mutation_free``) shares that decoded copy, any other
   call gets its own.  After the batch a tripwire re-pickles the shared arguments
   (a pickler that runs no checker-defined code) and compares the bytes: if they
   changed, every call that shared them is re-run on a private copy and the
   worker is recycled, so no verdict depends on another call's writes.
3. Worker process hardening (set up before any untrusted code runs):
   ``sys.addaudithook`` hook that always refuses file opens, ``os.*``,
   ``socket.*``, ``subprocess.*``, ``ctypes.*``, gc introspection, new code or
   function objects (one exception: outside strict mode, the worker's own
   ``replace(co_consts=...)`` of exactly the bytecode it is instantiating from a
   skeleton it compiled, see "Compiling by skeleton"); while untrusted code runs
   ("strict mode") it also refuses
   ``compile``/``exec`` (except the worker's own exec of the checker module),
   real imports, ``sys._getframe``, ``object.__getattr__`` events (``gi_frame``,
   ``tb_frame``, ``f_code``, ``__code__``...), ``object.__setattr__``, marshal and
   pickle class lookups.  A violation is sticky: swallowing the exception does
   not help, the call is reported ``forbidden`` and the worker is recycled.
   Kernel-level: empty network namespace (``unshare(CLONE_NEWNET)``), ``chroot``
   into an empty private temp dir, privileges dropped to ``nobody``, rlimits
   (``RLIMIT_AS`` memory, ``RLIMIT_CPU`` as a backstop renewed as completed calls add
   up, so it stops a call that escapes its timer; ``RLIMIT_NPROC=0``, ``RLIMIT_FSIZE=0``, ``RLIMIT_NOFILE`` = the fds it already has,
   ``RLIMIT_CORE=0``), ``PR_SET_NO_NEW_PRIVS``, ``PR_SET_DUMPABLE=0``,
   parent-death signal and a seccomp-BPF filter (x86_64) that fails every
   open/exec/fork/clone/socket/kill/ptrace/mount/... syscall with ``EPERM``.
   The environment is scrubbed (only PYTHONHASHSEED=0, TZ, LC_ALL: also makes
   results deterministic) and the interpreter runs with ``-S -s -B``.  The
   kernel layers that need root (netns, chroot, uid drop) are skipped silently
   when not root; ``Sandbox.isolation()`` reports which ones are active.
4. Time: a per-call ``setitimer`` raises inside checker code (not inside the
   worker's own bookkeeping) at ``call_timeout_s`` and then every 50 ms; the
   parent watches a shared-memory progress slot and SIGKILLs a worker whose
   current call overran ``call_timeout_s`` + grace (C-level hangs such as
   ``10**10**9`` that signals cannot interrupt, or code that swallows the
   timeout).  The call is reported ``timeout``; the rest of the batch is re-run
   on a fresh worker, so no other result is lost or misattributed.
5. Memory/output: ``MemoryError`` -> ``memory``; results are canonicalised to
   strict JSON (no NaN, no sets/objects -> ``bad_return``) and capped by
   ``max_result_bytes`` (``output_too_large``); ``print`` output is discarded and
   the worker's stdout/stderr are /dev/null, never the IPC channel.
6. Parent robustness: requests go parent->worker as pickle (trusted data);
   replies come back as length-capped JSON (never unpickled: a compromised worker
   must not get code execution in the parent); writes and reads use poll with
   deadlines; any garbage, EOF or death restarts the worker transparently.

What remains (honestly): see ``REMAINING_RISKS``.

Thread safety: a ``Sandbox`` may be shared between threads but calls are
serialised by an internal lock; use ``workers>1`` (batches are split across
workers) or several ``Sandbox`` objects for parallelism.
"""

from __future__ import annotations

import ast
import dis
import io
import itertools
import json
import marshal
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from types import CodeType
from typing import Any, Mapping, Sequence

__all__ = [
    "ALLOWED_MODULES",
    "ERROR_CODES",
    "REMAINING_RISKS",
    "CallResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "static_check",
]

# --------------------------------------------------------------------------------------
# Policy constants (shared by parent and worker)
# --------------------------------------------------------------------------------------

ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "math", "re", "json", "datetime", "collections", "itertools", "functools",
        "statistics", "string", "decimal", "fractions", "operator",
    }
)
# Submodules that may be imported by name (``import collections.abc``).
ALLOWED_SUBMODULES: frozenset[str] = frozenset({"collections.abc"})

ERROR_CODES: frozenset[str] = frozenset(
    {
        "compile_error", "forbidden", "timeout", "memory", "exception", "bad_return",
        "crash", "missing_entry", "output_too_large",
    }
)

# Calls the brief forbids outright (most are also simply absent from the builtins).
BANNED_CALLS: frozenset[str] = frozenset(
    {
        "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals",
        "locals", "vars", "input", "breakpoint", "help", "memoryview", "exit", "quit",
    }
)

# Non-dunder attributes that expose frames, code objects or class hierarchies:
# the classic route from any object to the worker's globals.
FORBIDDEN_ATTRS: frozenset[str] = frozenset(
    {
        "gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "gi_suspended",
        "cr_frame", "cr_code", "cr_await", "cr_origin", "cr_running", "cr_suspended",
        "ag_frame", "ag_code", "ag_await", "ag_running",
        "tb_frame", "tb_next", "tb_lasti", "tb_lineno",
        "f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_trace",
        "f_trace_lines", "f_trace_opcodes", "f_lasti", "f_lineno",
        "co_code", "co_consts", "co_names", "co_varnames", "co_freevars", "co_cellvars",
        "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_lnotab",
        "co_linetable", "co_exceptiontable", "co_flags", "co_argcount",
        "co_posonlyargcount", "co_kwonlyargcount", "co_nlocals", "co_stacksize",
        "co_positions", "co_lines",
        "mro",
    }
)

# Dunder attributes that are harmless to *read* (strings / re-running __init__).
ALLOWED_DUNDER_READS: frozenset[str] = frozenset({"__name__", "__qualname__", "__doc__", "__init__"})
# Dunder names a module/class body may assign.
ALLOWED_DUNDER_STORES: frozenset[str] = frozenset({"__all__", "__slots__"})
# Protocol methods a helper class may define; excludes __del__ (runs at GC time),
# __getattribute__/__init_subclass__/__set_name__/__reduce__... (hooks into machinery).
ALLOWED_DUNDER_DEFS: frozenset[str] = frozenset(
    {
        "__init__", "__repr__", "__str__", "__eq__", "__ne__", "__lt__", "__le__",
        "__gt__", "__ge__", "__hash__", "__bool__", "__len__", "__iter__", "__next__",
        "__contains__", "__getitem__", "__setitem__", "__delitem__", "__missing__",
        "__call__", "__enter__", "__exit__", "__add__", "__radd__", "__sub__",
        "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
        "__floordiv__", "__mod__", "__neg__", "__pos__", "__abs__", "__int__",
        "__float__", "__index__", "__round__", "__and__", "__or__", "__xor__",
    }
)

# --- Argument sharing --------------------------------------------------------------------
# A call whose compiled code cannot mutate its argument may share one decoded copy of it with
# the batch's other such calls (a private copy per call is most of a certification's sandbox
# cost).  Arguments are plain data (dict, list, str, numbers, bool, None), which only change
# through a subscript or attribute store/delete, an in-place operator, a mutating method (by
# attribute name, by an ``operator`` helper, or looked up by a ``case C(name=...)`` pattern),
# or a dunder such as ``__init__``; all of these are visible in the bytecode as opcodes or
# in ``co_names``.  A checker that uses any of them gets its own copy, as before.
_MUTATOR_NAMES: frozenset[str] = frozenset(
    {
        # dict / list / set / deque / Counter / OrderedDict / ChainMap methods that write
        "append", "extend", "insert", "remove", "pop", "popitem", "clear", "sort", "reverse",
        "setdefault", "update", "add", "discard", "difference_update", "intersection_update",
        "symmetric_difference_update", "appendleft", "extendleft", "popleft", "rotate",
        "move_to_end", "subtract", "maps", "parents",
        # operator helpers that write, or that reach a method by its name
        "setitem", "delitem", "iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imod", "imul",
        "imatmul", "ior", "ipow", "irshift", "isub", "itruediv", "ixor", "methodcaller", "attrgetter",
    }
)
_HARMLESS_DUNDER_NAMES: frozenset[str] = frozenset({"__name__", "__qualname__", "__module__", "__doc__"})
_MUTATING_OPCODES: frozenset[int] = frozenset(
    op for name, op in dis.opmap.items()
    if name in ("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_ATTR", "DELETE_ATTR", "STORE_SLICE", "DELETE_SLICE", "MATCH_CLASS")
    or name.startswith("INPLACE_")  # Python <= 3.10
)
_BINARY_OP: int | None = dis.opmap.get("BINARY_OP")  # Python >= 3.11: in-place operators are an oparg
_EXTENDED_ARG: int = dis.opmap["EXTENDED_ARG"]
_INPLACE_ARGS: frozenset[int] = frozenset(
    i for i, (_name, sym) in enumerate(getattr(dis, "_nb_ops", ())) if sym.endswith("=") and sym not in ("==", "!=", "<=", ">=")
) or frozenset(range(13, 26))


def _mutation_free(code: CodeType) -> bool:
    """True when ``code`` (and every function, lambda, comprehension and class body nested in
    it) contains no operation that could mutate a plain-data argument.  Conservative: a
    ``False`` only costs a private copy."""
    todo = [code]
    while todo:
        c = todo.pop()
        for name in c.co_names:
            if name in _MUTATOR_NAMES or (name.startswith("__") and name not in _HARMLESS_DUNDER_NAMES):
                return False
        raw = c.co_code  # 2-byte units (inline caches read as zeros)
        ops = raw[0::2]
        if not _MUTATING_OPCODES.isdisjoint(ops):
            return False
        if _BINARY_OP is not None:
            i = ops.find(_BINARY_OP)
            while i != -1:
                if raw[2 * i + 1] in _INPLACE_ARGS or (i and ops[i - 1] == _EXTENDED_ARG):
                    return False
                i = ops.find(_BINARY_OP, i + 1)
        todo.extend(k for k in c.co_consts if isinstance(k, CodeType))
    return True


class _PlainPickler(pickle.Pickler):
    """Pickles plain data only (exact dict, list, tuple, set, str, bytes, numbers, bool, None):
    anything else raises instead of running its reduce hooks, so the worker can pickle what
    checkers had in hand without executing code they defined."""

    def reducer_override(self, obj: Any) -> Any:
        raise pickle.PicklingError(f"{type(obj).__name__} is not plain data")


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj, protocol=5)
        return True
    except Exception:  # noqa: BLE001
        return False


def _plain_dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _PlainPickler(buf, protocol=5).dump(obj)
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# Compiling by skeleton (worker side)
#   Generated checkers are a few templates filled with different string literals (record
#   ids, names, phrases), and compiling one costs ~230 us while running it costs ~8 us.
#   The worker compiles a template once: each simple string literal is replaced by a
#   placeholder (the same one for equal values, so the compiler merges constants exactly
#   as it would; no newline, so every line number is unchanged), and a source of a known
#   skeleton gets the skeleton's code objects with the placeholders swapped for its own
#   strings.  Sound because the compiler never looks inside such a string except where it
#   folds or rewrites an expression around it; a skeleton where that can happen (an
#   operator on a string literal and a constant, ``'...' % x``, implicit concatenation) is
#   never used, and the first source of every skeleton is compiled from its text and must
#   equal the swapped code (bytecode, constants, names, line numbers).  Only column offsets
#   differ, which nothing reports (errors name the line).  A skeleton is compiled when its
#   second source arrives, so a one-off source costs one compile and a ~20 us scan.
#   A long source is compiled in two parts: the helpers before its last top-level ``def``
#   (the same text in every source of a template, compiled once per text) and the rest (by
#   skeleton), run in order in one namespace (``_CheckerCompiler.compile_parts``); a new
#   template then costs a compile of its ~1,000-character ``check`` instead of ~15,000.
# --------------------------------------------------------------------------------------

_LITERAL_TOKENS = re.compile(r"""(#[^\n]*|'[^'\n]*'|"[^"\n]*")""")
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NAME_CHARS = re.compile(r"[A-Za-z0-9_]+")
_PLACEHOLDERS: list[str] = []


class _TextCache(dict):  # type: ignore[type-arg]
    """Values by text (a source, a skeleton, a checker's helpers), least recently used first, bounded in entries and
    in the keys' total length (the worker runs under RLIMIT_AS). ``take`` a value out, ``put`` it back as the most
    recently used. A lock keeps the count right where threads share one (the parent's scan memo)."""

    def __init__(self, max_entries: int, max_chars: int) -> None:
        super().__init__()
        self.max_entries, self.max_chars, self.chars = max_entries, max_chars, 0
        self.lock = threading.Lock()

    def take(self, key: str, default: Any = None) -> Any:
        with self.lock:
            if key not in self:
                return default
            self.chars -= len(key)
            return dict.pop(self, key)

    def put(self, key: str, value: Any) -> None:
        with self.lock:
            if key in self:
                self.chars -= len(key)
                dict.__delitem__(self, key)
            while self and (len(self) >= self.max_entries or self.chars + len(key) > self.max_chars):
                oldest = next(iter(self))
                self.chars -= len(oldest)
                dict.__delitem__(self, oldest)
            self.chars += len(key)
            dict.__setitem__(self, key, value)


# text before a source's last top-level def -> its scan (see ``_skeleton``): prefixes of sources up to
# _SKELETON_MAX_CHARS, a few MB at most
_SCAN_MEMO = _TextCache(128, 4_000_000)
_SCAN_MEMO_MIN_CHARS = 2000  # shorter sources scan faster than their prefix is hashed and copied


def _placeholder(k: int) -> str:
    """The ``k``-th placeholder: a digit then base 62, so it never equals an identifier (the only
    strings the compiler makes up itself: keyword-argument, import and match-attribute names)."""
    while len(_PLACEHOLDERS) <= k:
        q, digits = len(_PLACEHOLDERS), ""
        while True:
            q, r = divmod(q, 62)
            digits = _BASE62[r] + digits
            if not q:
                break
        _PLACEHOLDERS.append("0" + digits)
    return _PLACEHOLDERS[k]


def _skeleton(source: str, memo: _TextCache | None = _SCAN_MEMO) -> tuple[str, int, dict[str, str]] | None:
    """(skeleton, number of string literals, placeholder -> value) of ``source``, or None when it
    has no string literal or one this scanner does not read exactly as Python does (escapes,
    line continuations, triple quotes, prefixes such as f/r/b, a carriage return: a line end to
    Python but not to this scanner).  Comments become a bare ``#`` (the compiler ignores them; a
    coding declaration is kept), so a comment's words or non-ASCII letters never reach the
    policy's text test and sources that differ in comments only share a skeleton.

    A token never spans a line, so the text up to a line start scans the same alone as inside
    the whole: ``memo`` keeps the scan of everything before the last top-level ``def`` (the
    helpers a template's sources share, ~85% of a generated checker) and only the rest is
    scanned again."""
    if "\\" in source or "'''" in source or '"""' in source or "\x00" in source or "\r" in source or "__future__" in source:
        return None
    cut = _helpers_end(source) if memo is not None else 0
    values: dict[str, str] = {}
    if cut:
        prefix = source[:cut]
        state = memo.take(prefix)
        if state is None:
            found = _scan(prefix, [], {}, 0)
            if found is None:
                return None
            state = ("".join(found[0]), found[1], found[2], _values(found[1], 0))
        memo.put(prefix, state)
        found = _scan(source[cut:], [state[0]], dict(state[1]), state[2])
        values.update(state[3])
    else:
        found = _scan(source, [], {}, 0)
    if found is None:
        return None
    out, seen, n_literals = found
    if not seen:
        return None
    values.update(_values(seen, len(values)))
    return "".join(out), n_literals, values


def _helpers_end(source: str) -> int:
    """Where ``source``'s last top-level ``def`` starts (a generated checker: its helpers, then ``check``), or 0
    for a source too short to gain from scanning or compiling its helpers apart, or too long for skeletons."""
    return source.rfind("\ndef ") + 1 if _SCAN_MEMO_MIN_CHARS < len(source) <= _SKELETON_MAX_CHARS else 0


def _values(seen: dict[str, str], start: int) -> dict[str, str]:
    """placeholder -> value for the values of ``seen`` from the ``start``-th on, interned as the compiler does."""
    return {p: sys.intern(value) if _NAME_CHARS.fullmatch(value) else value for value, p in itertools.islice(seen.items(), start, None)}


def _scan(text: str, out: list[str], seen: dict[str, str], n_literals: int) -> tuple[list[str], dict[str, str], int] | None:
    """Append ``text``'s skeleton to ``out`` (placeholders numbered on from ``seen``), or None when a
    literal has a prefix."""
    parts = _LITERAL_TOKENS.split(text)
    out.append(parts[0])
    for i in range(1, len(parts), 2):
        tok = parts[i]
        quote = tok[0]
        if quote != "#":
            n_literals += 1
            before = parts[i - 1]
            if before and (before[-1].isalnum() or before[-1] == "_"):
                return None  # a string prefix (or a literal glued to a name: a syntax error anyway)
            if len(tok) > 2:
                value = tok[1:-1]
                p = seen.get(value)
                if p is None:
                    p = seen[value] = _placeholder(len(seen))
                tok = quote + p + quote
        elif "coding" not in tok:
            tok = "#"
        out.append(tok)
        out.append(parts[i + 1])
    return out, seen, n_literals


def _skeleton_usable(tree: ast.AST, n_literals: int, placeholders: Mapping[str, str]) -> bool:
    """True when no string literal of the skeleton is folded or rewritten by the compiler, so its
    code objects hold each one as a constant of its own (checked on the skeleton's AST)."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is str:
            n += 1
            if node.value and node.value not in placeholders:
                return False  # implicit concatenation joined two literals
        elif isinstance(node, ast.BinOp):
            left, right = node.left, node.right
            left_str = isinstance(left, ast.Constant) and type(left.value) is str
            right_str = isinstance(right, ast.Constant) and type(right.value) is str
            if left_str and isinstance(node.op, ast.Mod):
                return False  # '%s' % (x,) is rewritten as a format
            if (left_str and isinstance(right, (ast.Constant, ast.Tuple))) or (right_str and isinstance(left, (ast.Constant, ast.Tuple))):
                return False  # 'a' + 'b', 'a' * 3: folded into one constant
        elif isinstance(node, ast.UnaryOp):
            if isinstance(node.operand, ast.Constant) and type(node.operand.value) is str:
                return False
        elif isinstance(node, ast.Subscript):  # 'abc'[0] is folded
            if isinstance(node.value, ast.Constant) and type(node.value.value) is str:
                return False
        elif isinstance(node, ast.JoinedStr):
            return False
    return n == n_literals


def _swap_constant(k: Any, values: Mapping[str, str], swap_code: Any) -> Any:
    t = type(k)
    if t is str:
        return values.get(k, k)
    if t is tuple:
        return tuple([_swap_constant(x, values, swap_code) for x in k])
    if t is frozenset:
        return frozenset([_swap_constant(x, values, swap_code) for x in k])
    if t is CodeType:
        return swap_code(k)
    return k


@dataclass(frozen=True)
class _FirstSource:
    """The first source seen of a skeleton: its literal count, strings and compiled code."""

    n_literals: int
    values: dict[str, str]
    code: Any


class _CheckerCompiler:
    """Source -> (code, mutation_free) or the compile error as a str, by skeleton where it can
    (see "Compiling by skeleton"); keeps the skeletons it has seen (least recently used out)."""

    def __init__(self, st: Any) -> None:
        self.st = st  # the worker's audit-hook state (``recode``)
        # skeleton -> _FirstSource (seen once), (code, mutation_free, memo) (usable) or None (compile such sources)
        self.skeletons = _TextCache(_CODE_CACHE_ENTRIES, _CODE_CACHE_CHARS)
        self.compiled = 0  # compile() calls on text (reset per batch by the worker)
        self.instantiated = 0  # sources made from a known skeleton
        self.heads = _TextCache(_HEAD_CACHE_ENTRIES, _CODE_CACHE_CHARS)  # helpers' text -> (compile() entry, line count)

    def compile_parts(self, source: str) -> Any:
        """(the code objects to run in order in one namespace, mutation_free) for ``source``, or its compile
        error as a str.  A generated checker is helpers (the same text in every source of its template and
        ~85% of it) and then ``check``: the helpers are compiled once per text, and the rest alone, with the
        helpers' lines as blank lines so every line number is the one it has in ``source``.  Running both
        in one namespace is running ``source``: a module is its top-level statements in order, and a ``def``
        at column 0 starts a statement.  Where either part does not compile alone (a decorator or an open
        bracket before the ``def``) the whole source is compiled, and its own error is the one reported.
        (One difference, which no generated checker can see: equal string constants of the two parts are
        not merged into one object, so ``is`` between them is False.)"""
        cut = _helpers_end(source) if "__future__" not in source else 0  # a future import is the whole module's
        if cut:
            text = source[:cut]
            head = self.heads.take(text)
            if head is None:
                head = (self.compile(text), text.count("\n"))
            self.heads.put(text, head)
            entry, lines = head
            if not isinstance(entry, str):
                tail = self.compile("\n" * lines + source[cut:], scan_memo=None)
                if not isinstance(tail, str):
                    return ((entry[0], tail[0]), entry[1] and tail[1])
        whole = self.compile(source)
        return whole if isinstance(whole, str) else ((whole[0],), whole[1])

    def compile(self, source: str, scan_memo: _TextCache | None = _SCAN_MEMO) -> Any:
        """Instantiate ``source``'s skeleton when it is known and usable (see "Compiling by skeleton"),
        else compile the text.  A skeleton is learnt when its second source arrives (a one-off
        source, e.g. an LLM's, costs one compile and a scan), against the first source's code."""
        sk = _skeleton(source, scan_memo) if len(source) <= _SKELETON_MAX_CHARS else None
        if sk is None:
            return self._compile_text(source)
        skeleton, n_literals, values = sk
        known = self.skeletons.take(skeleton, False)
        if known is False or type(known) is _FirstSource:
            if known is False:
                entry = self._compile_text(source)
                if not isinstance(entry, str):  # a source that does not compile teaches nothing
                    self.skeletons.put(skeleton, _FirstSource(n_literals, values, entry[0]))
                return entry
            known = self._learn(skeleton, known)
        self.skeletons.put(skeleton, known)
        if known is not None:
            try:
                code = (self._swap_constants(known[0], values, known[2]), known[1])
                self.instantiated += 1
                return code
            except Exception:  # noqa: BLE001 - e.g. an interpreter that audits replace() differently
                self.skeletons.put(skeleton, None)
        return self._compile_text(source)

    def _compile_text(self, source: str) -> Any:
        self.compiled += 1
        try:
            compiled = compile(source, CHECKER_FILENAME, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
        except (ValueError, MemoryError, RecursionError, OverflowError) as exc:
            return f"{type(exc).__name__}: {str(exc)[:200] or 'source too complex'}"
        return (compiled, _mutation_free(compiled))

    def _learn(self, skeleton: str, first: "_FirstSource") -> Any:
        """(code, mutation_free) of ``skeleton`` when it is usable, else None: no literal is folded
        or rewritten, and its code with the first source's strings swapped in equals that source's
        own compiled code (bytecode, constants, names, line numbers: all but columns)."""
        try:
            tree = ast.parse(skeleton, filename=CHECKER_FILENAME, mode="exec")
            if not _skeleton_usable(tree, first.n_literals, first.values):
                return None
            self.compiled += 1
            code = compile(skeleton, CHECKER_FILENAME, "exec", dont_inherit=True)
            if not self._same_but_columns(self._swap_constants(code, first.values), first.code):
                return None
            return (code, _mutation_free(code), {})  # the last memo: see _swap_constants
        except Exception:  # noqa: BLE001 - e.g. a skeleton that does not compile: its sources are compiled from text
            return None

    def _same_but_columns(self, a: Any, b: Any) -> bool:
        """``a == b`` for code objects, nested ones included, except for column offsets."""
        if list(a.co_lines()) != list(b.co_lines()):
            return False
        nested_a = [k for k in a.co_consts if type(k) is CodeType]
        nested_b = [k for k in b.co_consts if type(k) is CodeType]
        if len(nested_a) != len(nested_b) or not all(map(self._same_but_columns, nested_a, nested_b)):
            return False

        def flat(c: Any) -> Any:  # nested code objects as numbered markers (compared above), no line table
            consts = tuple(("\x00code", i) if type(k) is CodeType else k for i, k in enumerate(c.co_consts))
            self.st.recode = c.co_code
            try:
                return c.replace(co_consts=consts, co_linetable=b"")
            finally:
                self.st.recode = None

        return flat(a) == flat(b)

    def _swap_constants(self, code: Any, values: Mapping[str, str], memo: dict[int, Any] | None = None) -> Any:
        """``code`` (and every code object nested in it) with placeholder constants swapped for values.

        ``memo`` (the skeleton's own: id of a skeleton code object -> its last constants and code) gives a
        code object whose constants equal the last source's that very code again: the helpers a template's
        sources share (most of its code objects) are made once, not once per source.  Code objects are
        immutable, so sources share them as calls of one source do."""
        st = self.st

        def swap_code(c: Any) -> Any:
            consts = tuple([_swap_constant(k, values, swap_code) for k in c.co_consts])
            if memo is not None:
                last = memo.get(id(c))
                if last is not None and _same_constants(last[0], consts):
                    return last[1]
            st.recode = c.co_code  # let the audit hook pass exactly this replace()
            try:
                made = c.replace(co_consts=consts)
            finally:
                st.recode = None
            if memo is not None:
                memo[id(c)] = (consts, made)
            return made

        return swap_code(code)


def _same_constants(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The constants of two instances of one skeleton code object are the same: everything but the swapped
    strings (and the tuples and sets around them) is the skeleton's very object, and nested code objects
    are equal only as the same object."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is not y and (type(x) is not type(y) or type(x) is CodeType or x != y):
            return False
    return True


MAX_SOURCE_CHARS = 200_000  # bounds parse time/memory in the parent
MAX_MESSAGE_CHARS = 500
CHECKER_FILENAME = "<checker>"
CHECKER_MODULE_NAME = "checker"

REMAINING_RISKS: tuple[str, ...] = (
    "The static layer is what keeps dunder attributes (__globals__, __closure__, "
    "__subclasses__) out of reach; code that bypassed it could reach worker internals, "
    "switch the audit hook's strict mode off or rewrite its closure cells (the hook is "
    "a Python function), and write to the worker's reply pipe (the parent then sees "
    "garbage: 'crash').  What still holds then: no file can be opened or written, no "
    "process spawned, no socket created, no signal sent (seccomp, chroot, nobody uid, "
    "empty netns, rlimits), and the parent never unpickles worker output.",
    "str.format/format_map field syntax ('{0.__class__...}') traverses dunder "
    "attributes at runtime; it yields strings only (reprs of the worker's scrubbed "
    "state), never object references, and cannot call code.",
    "A CPython memory-safety bug reachable from the exposed builtins/modules bypasses "
    "the Python layers; the kernel layers above still apply.",
    "Workers are reused across batches.  Shared state is frozen (classes), reset "
    "(decimal context, globals, builtins, argument copies) or checked between batches "
    "(ABC registrations, enum members' private attributes: the worker is then "
    "recycled); mutations of state not covered here could influence later calls.",
    "Without root the netns/chroot/uid-drop layers are skipped; off x86_64 no seccomp "
    "filter is installed.  Sandbox.isolation() reports what is active.",
    "Timing side channels and nondeterministic builtins (datetime.now, id) are not "
    "contained.",
    "Calls that share a decoded argument rely on the bytecode proof that they cannot "
    "write to it; the after-batch tripwire catches a write the proof missed, unless "
    "one call's write is undone by a later call of the same batch (the calls in "
    "between would have seen it).  With copy_arguments=False every call shares "
    "and only the tripwire stands.",
    "Sources instantiated from a checker skeleton run code compiled from the "
    "skeleton (the scanner gives up on anything it does not read exactly as Python "
    "does, and a skeleton is used only after one of its sources compiled to the "
    "same code); to swap in their strings the worker itself creates code objects, "
    "which the audit hook allows only outside strict mode and only for the bytecode "
    "being instantiated at that moment.  A finalizer of a checker object running in "
    "that window would need a reference to that very code object (which the static "
    "policy and the runtime introspection rules keep out of reach) to do the same.",
)


class SandboxError(RuntimeError):
    """Infrastructure failure (worker could not start); never a checker verdict."""


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: float = 5.0  # per checker per batch (its calls' seconds); also the RLIMIT_CPU backstop for a call escaping its timer
    call_timeout_s: float = 1.0  # per call, in-worker setitimer + parent wall-clock backstop
    memory_mb: int = 512  # RLIMIT_AS of each worker
    max_result_bytes: int = 100_000  # serialized JSON size of one returned value


@dataclass
class CallResult:
    ok: bool  # the call ran and returned a JSON-able value
    value: object = None  # bool/float/int/str/None/list/dict
    error_code: str | None = None  # one of ERROR_CODES
    error: str | None = None  # short human message
    seconds: float = 0.0


# --------------------------------------------------------------------------------------
# Layer 1: static AST policy
# --------------------------------------------------------------------------------------


def _module_allowed(name: str) -> bool:
    if not name or any(part.startswith("_") for part in name.split(".")):
        return False
    return name in ALLOWED_MODULES or name in ALLOWED_SUBMODULES


def _unsafe_attr_name(name: object) -> bool:
    """Runtime twin of the static attribute rule (for attrgetter/hasattr...)."""
    if not isinstance(name, str):
        return True
    return any(part.startswith("__") or part in FORBIDDEN_ATTRS for part in name.split("."))


@dataclass(frozen=True)
class _Verdict:
    compile_error: str | None
    violations: tuple[str, ...]
    nondeterministic: bool = False  # calls a time/random/identity function (see ``calls_nondeterministic``)


def _policy_violations(tree: ast.AST) -> list[str]:
    # ast.walk is iterative, so adversarially deep trees cannot blow the parent's stack.
    nodes = list(ast.walk(tree))
    assigned: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            assigned.add(node.id)
        elif isinstance(node, ast.arg):
            assigned.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            assigned.add(node.name)
        elif isinstance(node, ast.alias):
            assigned.add((node.asname or node.name).split(".")[0])

    out: list[str] = []

    def bad(node: ast.AST, msg: str) -> None:
        out.append(f"line {getattr(node, 'lineno', '?')}: {msg}")

    def check_dunder(node: ast.AST, name: str | None, what: str) -> None:
        if name and name.startswith("__"):
            bad(node, f"{what} {name!r} is not allowed (dunder names are forbidden)")

    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _module_allowed(alias.name):
                    bad(node, f"import of module {alias.name!r} is not allowed")
                check_dunder(node, alias.asname, "alias")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                bad(node, "relative imports are not allowed")
            elif not _module_allowed(node.module or ""):
                bad(node, f"import from module {node.module!r} is not allowed")
            for alias in node.names:
                if alias.name != "*" and alias.name.startswith("_"):
                    bad(node, f"import of private name {alias.name!r} is not allowed")
                check_dunder(node, alias.asname, "alias")
        elif isinstance(node, ast.Name):
            name = node.id
            if name.startswith("__"):
                ok_read = isinstance(node.ctx, ast.Load) and name == "__name__"
                ok_store = isinstance(node.ctx, ast.Store) and name in ALLOWED_DUNDER_STORES
                if not (ok_read or ok_store):
                    bad(node, f"name {name!r} is not allowed (dunder names are forbidden)")
            elif isinstance(node.ctx, ast.Load) and name in BANNED_CALLS and name not in assigned:
                bad(node, f"use of builtin {name!r} is not allowed")
        elif isinstance(node, ast.Attribute):
            attr = node.attr
            if attr.startswith("__"):
                if not (attr in ALLOWED_DUNDER_READS and isinstance(node.ctx, ast.Load)):
                    bad(node, f"attribute {attr!r} is not allowed (dunder attributes are forbidden)")
            elif attr in FORBIDDEN_ATTRS:
                bad(node, f"attribute {attr!r} is not allowed (introspection)")
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
                bad(node, f"call to {node.func.id}() is not allowed")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("__") and node.name not in ALLOWED_DUNDER_DEFS:
                bad(node, f"defining method {node.name!r} is not allowed")
        elif isinstance(node, ast.ClassDef):
            check_dunder(node, node.name, "class name")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                check_dunder(node, name, "name")
        elif isinstance(node, ast.ExceptHandler):
            check_dunder(node, node.name, "name")
        elif isinstance(node, ast.arg):
            check_dunder(node, node.arg, "argument")
        elif isinstance(node, ast.MatchClass):
            # ``case C(__class__=x)`` looks attributes up by name.
            for attr in node.kwd_attrs:
                if attr.startswith("__") or attr in FORBIDDEN_ATTRS:
                    bad(node, f"pattern attribute {attr!r} is not allowed")
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)):
            check_dunder(node, node.name, "name")
        elif isinstance(node, ast.MatchMapping):
            check_dunder(node, node.rest, "name")
    return out


# Every identifier the policy can object to, other than dunders and imports.
_POLICY_WORDS: frozenset[str] = BANNED_CALLS | FORBIDDEN_ATTRS
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _policy_clean_text(source: str) -> bool:
    """True when no AST of ``source`` can violate the policy, judged from the text alone.

    Every rule of ``_policy_violations`` fires on an identifier (a name, attribute, alias,
    argument, pattern keyword) that starts with ``__``, or is in ``BANNED_CALLS`` /
    ``FORBIDDEN_ATTRS``, or on an import statement (other than a plain import of an allowed
    module, on a line of its own: see ``_without_allowed_imports``).  In ASCII source every identifier of the
    AST is spelled verbatim in the text as a whole identifier token (non-ASCII identifiers
    are NFKC-normalised, so they are excluded here), so the absence of ``__``, of the word
    ``import`` and of every policy word as a token proves the walk would find nothing.
    Strings and comments can only cause false alarms, which fall back to the full walk; words
    inside simple string literals (``{'status': 'open'}``, an 'import' in a message, a non-ASCII
    name) are not even that: when the text alone fails, its skeleton (every simple literal
    replaced by a placeholder, see "Compiling by skeleton") is judged instead; it has the
    same identifiers, since the scanner reads literals exactly as Python does or gives up.
    """
    if _clean_text(source):
        return True
    sk = _skeleton(source)
    return sk is not None and _clean_text(sk[0])


def _clean_text(text: str) -> bool:
    if "import" in text:
        text = _without_allowed_imports(text)
        if text is None:
            return False
    return (
        text.isascii()
        and "__" not in text
        and "import" not in text
        and _POLICY_WORDS.isdisjoint(_IDENTIFIER.findall(text))
    )


# A whole line that is one import statement of an allowed module (``import re``, ``from datetime import
# datetime, timezone``: no alias, no star, nothing else on the line), as helper functions of generated
# checkers write them.
_IMPORT_LINE = re.compile(r"[ \t]*(?:import ([a-z]+)|from ([a-z]+) import ([A-Za-z_][A-Za-z0-9_]*(?:[ \t]*,[ \t]*[A-Za-z_][A-Za-z0-9_]*)*))[ \t]*")


def _without_allowed_imports(text: str) -> str | None:
    """``text`` without its lines that import allowed modules or plain names from them, or None when a
    line mentions ``import`` any other way. Sound for the text test: the walk allows exactly such
    statements (the module is allowed, no imported name is a dunder or a policy word), and a line
    that matches but sits inside a string literal is string content, which no rule looks at."""
    kept = []
    for line in text.split("\n"):
        if "import" not in line:
            kept.append(line)
            continue
        m = _IMPORT_LINE.fullmatch(line)
        if m is None:
            return None
        module = m.group(1) or m.group(2)
        names = [n.strip() for n in (m.group(3) or "").split(",") if n.strip()]
        if module not in ALLOWED_MODULES or any(n.startswith("__") or n in _POLICY_WORDS or n == "import" for n in names):
            return None
    return "\n".join(kept)


# Sources up to this size whose text is policy-clean skip the parent's parse in ``evaluate``: the
# worker compiles them anyway and reports a syntax error exactly as the parse would (same parser,
# same ``compile_error`` message).  The bound keeps nesting depth (<= characters) far below the
# parse/compile recursion limits, so neither side can fail where the other would not.
_TEXT_ONLY_MAX_CHARS = 1500


@lru_cache(maxsize=4096)
def _text_only_clean(source: str) -> bool:
    return len(source) <= _TEXT_ONLY_MAX_CHARS and _policy_clean_text(source)


@lru_cache(maxsize=4096)
def _analyze(source: str) -> _Verdict:
    """Parse + policy check, cached by source text (sources repeat across batches) and, for a
    source that parses, by skeleton: no policy rule looks at a string constant, and a skeleton
    has the source's very AST but for string constants (same names, attributes, imports and line
    numbers), so both get the same violations.  A skeleton that does not parse proves nothing
    (the source's own error message is reported): the source is analysed itself."""
    if len(source) > MAX_SOURCE_CHARS:
        return _Verdict(f"source too large ({len(source)} > {MAX_SOURCE_CHARS} characters)", ())
    sk = _skeleton(source)
    if sk is not None:
        verdict = _analyze_text(sk[0])
        if verdict.compile_error is None:
            return verdict
    return _analyze_text(source)


@lru_cache(maxsize=4096)
def _analyze_text(source: str) -> _Verdict:
    verdict = _parse_and_walk(source)
    return _Verdict(verdict.compile_error, verdict.violations, _calls_nondeterministic(source))


def _parse_and_walk(source: str, split: bool = True) -> _Verdict:
    cut = _helpers_end(source) if split and "__future__" not in source else 0
    if cut and _policy_clean_text(source):
        # Nothing to walk for: the source only has to parse, which it does when its helpers and the rest
        # each parse alone (see ``_CheckerCompiler.compile_parts``); the helpers' text is shared by every
        # source of a template and parsed once.  Otherwise the whole source gives its own error below.
        head = source[:cut]
        if _helpers_parse(head) and _parses("\n" * head.count("\n") + source[cut:]):
            return _Verdict(None, ())
    try:
        tree = ast.parse(source, filename=CHECKER_FILENAME, mode="exec")
    except SyntaxError as exc:
        return _Verdict(f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})", ())
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes / too complex
        return _Verdict(f"{type(exc).__name__}: {str(exc)[:200] or 'source too complex'}", ())
    if _policy_clean_text(source):  # the walk below would find nothing (most generated checkers)
        return _Verdict(None, ())
    try:
        return _Verdict(None, tuple(_policy_violations(tree)))
    except RecursionError:
        return _Verdict(None, ("source too complex to analyse",))


def _parses(text: str) -> bool:
    try:
        ast.parse(text, filename=CHECKER_FILENAME, mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


_helpers_parse = lru_cache(maxsize=256)(_parses)  # helpers' texts: a few per template, each parsed once


_NONDETERMINISTIC_NAMES = ("now", "today", "utcnow", "random", "uuid", "id", "hash", "time")
_NONDETERMINISTIC = re.compile(r"\b(%s)\s*\(" % "|".join(_NONDETERMINISTIC_NAMES))


def _calls_nondeterministic(text: str) -> bool:
    # The regex tries every position (~17 us per checker); most checkers put none of these names
    # right before a parenthesis once whitespace is squeezed out (what ``\s*`` allows), which a
    # few substring searches rule out.
    squeezed = "".join(text.split())
    if not any(w + "(" in squeezed for w in _NONDETERMINISTIC_NAMES):
        return False
    return _NONDETERMINISTIC.search(text) is not None


def calls_nondeterministic(source: str) -> bool:
    """True when ``source`` calls a time, random or identity function (``now(``, ``random(``, ``id(``...), read
    in its skeleton where it has one (see ``_analyze``: not in its string literals or comments) and cached with
    its policy verdict.  A hint for the validator, which also grades the same trajectory twice."""
    return isinstance(source, str) and _analyze(source).nondeterministic


def static_check(source: str) -> list[str]:
    """AST policy violations of ``source`` as human messages with line numbers.

    An empty list means the source passed the static layer (it still runs under
    all runtime layers).  Unparseable source cannot be certified and yields one
    message describing the syntax error.
    """
    if not isinstance(source, str):
        return ["source must be a str"]
    verdict = _analyze(source)
    if verdict.compile_error is not None:
        return [f"cannot parse: {verdict.compile_error}"]
    return list(verdict.violations)


# --------------------------------------------------------------------------------------
# Wire protocol
#   parent -> worker: <u64 len><pickle>          (trusted data only)
#   worker -> parent: <u32 hlen><u32 vlen><json header><comma-joined json values>
#                     (JSON only, never unpickled: the worker may be compromised)
#   progress slot (shared memfd, 16 bytes): <u32 seq><i32 idx><f64 monotonic start>
# --------------------------------------------------------------------------------------

_REQ_HEADER = struct.Struct("<Q")
_RESP_HEADER = struct.Struct("<II")
_PROGRESS = struct.Struct("<Iid")
_IDLE = -(2**31)  # progress idx between batches; idx >= 0: call; idx < 0: compiling source -idx-1
_TICK_S = 0.05  # repeat interval of the in-worker timer after the first expiry
_CODE_CACHE_ENTRIES = 512  # compiled sources a worker keeps across batches
_CODE_CACHE_CHARS = 2_000_000  # ... and their total size (bounded memory under RLIMIT_AS)
_HEAD_CACHE_ENTRIES = 64  # checkers' helpers a worker keeps compiled (see ``compile_parts``)
_SKELETON_MAX_CHARS = 50_000  # longer sources are compiled from text (scanning them costs more than it saves; the
# longest embedded checkers, a moved meeting's emails with their prelude, are ~42,500)
_WORKER_FLAG = "--cowork-sandbox-worker"
_THIS_FILE = os.path.abspath(__file__)
_NOBODY = 65534


# --------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------


def _worker_env() -> dict[str, str]:
    # Scrubbed: nothing of the parent's environment (credentials, HOME, paths) leaks.
    env = {"PYTHONHASHSEED": "0", "TZ": "UTC0", "LC_ALL": "C"}
    if os.environ.get("COWORK_SANDBOX_DEBUG") == "1":
        env["COWORK_SANDBOX_DEBUG"] = "1"
    return env


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class _Job:
    seq: int
    calls: list[int]  # global call indices, in order
    src_ids: list[int]  # global source index per local source index
    sent_at: float = 0.0
    budget_s: float = 0.0


class _Worker:
    """One worker process plus its pipes and progress slot (parent-side handle)."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self.req_w = -1
        self.resp_r = -1
        self.shm: Any = None
        self.tmpdir: str | None = None
        self.buf = bytearray()
        self.eof = False
        self.hello: dict[str, Any] | None = None
        self._finalizer: weakref.finalize | None = None

    # -- lifecycle -------------------------------------------------------------------
    def spawn(self) -> None:
        import mmap

        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        shm_fd = os.memfd_create("cowork-sandbox-progress")
        os.ftruncate(shm_fd, _PROGRESS.size)
        self.shm = mmap.mmap(shm_fd, _PROGRESS.size)
        _PROGRESS.pack_into(self.shm, 0, 0, _IDLE, 0.0)
        self.tmpdir = tempfile.mkdtemp(prefix="cowork-sandbox-")
        for fd in (req_w, resp_r):
            try:  # bigger pipes: fewer wake-ups for large argument batches
                import fcntl

                fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
            except OSError:
                pass
        debug = os.environ.get("COWORK_SANDBOX_DEBUG") == "1"
        cmd = [
            sys.executable, "-S", "-s", "-B", "-X", "utf8", _THIS_FILE, _WORKER_FLAG,
            str(req_r), str(resp_w), str(shm_fd), str(self.memory_mb),
        ]
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if debug else subprocess.DEVNULL,
                pass_fds=(req_r, resp_w, shm_fd),
                cwd=self.tmpdir,
                env=_worker_env(),
                close_fds=True,
                start_new_session=True,  # terminal signals to our group don't reach it
            )
        finally:
            for fd in (req_r, resp_w, shm_fd):
                os.close(fd)
        os.set_blocking(req_w, False)
        os.set_blocking(resp_r, False)
        self.req_w, self.resp_r = req_w, resp_r
        self.buf = bytearray()
        self.eof = False
        self.hello = None
        self._finalizer = weakref.finalize(
            self, _reap, self.proc, self.req_w, self.resp_r, self.shm, self.tmpdir
        )

    def alive(self) -> bool:
        return self.proc is not None and not self.eof and self.proc.poll() is None

    def kill(self) -> int | None:
        """SIGKILL + reap + release resources; returns the worker's return code."""
        proc = self.proc
        if proc is None:
            return None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        rc = _reap(proc, self.req_w, self.resp_r, self.shm, self.tmpdir)
        self.proc, self.req_w, self.resp_r, self.shm, self.tmpdir = None, -1, -1, None, None
        self.hello = None
        return rc

    def ensure_ready(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or not self.alive():
            self.kill()
            self.spawn()
        if self.hello is not None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            frame = self.take_frame(1 << 16, 0)
            if frame is not None:
                try:
                    hello = json.loads(frame[0])
                except ValueError:
                    hello = None
                if not isinstance(hello, dict) or hello.get("hello") is not True:
                    self.kill()
                    raise SandboxError(f"sandbox worker failed to start: {str(hello)[:MAX_MESSAGE_CHARS]}")
                self.hello = hello
                return
            if self.eof:
                rc = self.kill()
                raise SandboxError(f"sandbox worker exited during startup ({_signal_name(rc)})")
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise SandboxError("sandbox worker did not start in time")
            self.wait_readable(left)

    # -- I/O -------------------------------------------------------------------------
    def wait_readable(self, timeout_s: float) -> None:
        poller = select.poll()
        poller.register(self.resp_r, select.POLLIN)
        if poller.poll(max(0, int(timeout_s * 1000) + 1)):
            self.pump()

    def pump(self) -> None:
        """Read whatever is available (non-blocking); sets eof on EOF/error."""
        while True:
            try:
                chunk = os.read(self.resp_r, 1 << 20)
            except BlockingIOError:
                return
            except OSError:
                self.eof = True
                return
            if not chunk:
                self.eof = True
                return
            self.buf += chunk
            if len(chunk) < (1 << 20):
                return

    def take_frame(self, max_header: int, max_values: int) -> tuple[bytes, bytes] | None:
        """Complete (header, values) frame or None; raises ValueError on a bad frame."""
        if self.resp_r >= 0 and not self.eof:
            self.pump()
        if len(self.buf) < _RESP_HEADER.size:
            return None
        hlen, vlen = _RESP_HEADER.unpack_from(self.buf, 0)
        if hlen > max_header or vlen > max_values:
            raise ValueError(f"oversized reply ({hlen}+{vlen} bytes)")
        end = _RESP_HEADER.size + hlen + vlen
        if len(self.buf) < end:
            return None
        header = bytes(self.buf[_RESP_HEADER.size : _RESP_HEADER.size + hlen])
        values = bytes(self.buf[_RESP_HEADER.size + hlen : end])
        del self.buf[:end]
        return header, values

    def send(self, payload: bytes, deadline: float) -> bool:
        """Write a request without ever blocking past ``deadline`` (worker may be stuck)."""
        data = memoryview(_REQ_HEADER.pack(len(payload)) + payload)
        poller = select.poll()
        poller.register(self.req_w, select.POLLOUT)
        while data:
            try:
                n = os.write(self.req_w, data)
                data = data[n:]
                continue
            except BlockingIOError:
                pass
            except OSError:  # EPIPE: worker died
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(int(left * 1000) + 1)
            if self.proc is None or self.proc.poll() is not None:
                return False
        return True

    def progress(self) -> tuple[int, int, float]:
        if self.shm is None:
            return (0, _IDLE, 0.0)
        return _PROGRESS.unpack_from(self.shm, 0)


def _reap(proc: subprocess.Popen[bytes], req_w: int, resp_r: int, shm: Any, tmpdir: str | None) -> int | None:
    """Kill and clean up a worker; module-level so weakref.finalize holds no self."""
    rc = None
    try:
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait(timeout=5)
    except Exception:  # pragma: no cover - reaping is best effort
        pass
    for fd in (req_w, resp_r):
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
    if shm is not None:
        try:
            shm.close()
        except Exception:
            pass
    if tmpdir:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)
    return rc


class Sandbox:
    """Pool of hardened worker processes running untrusted checker functions.

    ``evaluate`` is serialised by an internal lock (safe to share between threads,
    but one batch runs at a time); with ``workers > 1`` a batch is split across
    workers.  Workers are restarted transparently after a crash, a kill, a
    timeout or a runtime policy violation.

    ``copy_arguments=True`` (default): a call whose code could write to its argument
    gets its own fresh copy, so a checker that mutates its evidence cannot influence
    later calls; calls proven read-only share one decoded copy per argument (see
    layer 2 above).  ``False`` shares the decoded copy with every call, guarded by the
    after-batch tripwire only.  ``static_policy=False`` skips layer 1 and exists only
    so tests can probe the runtime layers directly.
    """

    def __init__(
        self,
        workers: int = 1,
        limits: SandboxLimits = SandboxLimits(),
        *,
        copy_arguments: bool = True,
        static_policy: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if limits.call_timeout_s <= 0 or limits.cpu_seconds <= 0 or limits.memory_mb < 64:
            raise ValueError(f"invalid limits: {limits}")
        self.limits = limits
        self.copy_arguments = copy_arguments
        self.static_policy = static_policy
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        # Cumulative figures the workers report per batch (for benchmarks; never trusted for decisions):
        # compile seconds, sources compiled from text and instantiated from a known skeleton, seconds
        # spent decoding and copying arguments, calls run, calls that shared arguments / were re-run.
        self.stats: dict[str, float] = {"batches": 0, "calls": 0, "compiled": 0, "compile_s": 0.0, "decode_s": 0.0,
                                        "shared_calls": 0, "rerun_calls": 0, "instantiated": 0}
        self._workers = [_Worker(limits.memory_mb) for _ in range(workers)]
        for w in self._workers:  # start now so the first batch does not pay the spawn
            w.spawn()

    # -- public API ------------------------------------------------------------------
    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for w in self._workers:
                w.kill()

    def isolation(self) -> dict[str, Any]:
        """Facts reported by a live worker: active layers, uid, env keys, root listing."""
        with self._lock:
            self._check_open()
            w = self._workers[0]
            w.ensure_ready()
            assert w.hello is not None
            return dict(w.hello)

    def evaluate(
        self,
        sources: Mapping[str, str],
        calls: Sequence[tuple[str, object]],
        entry: str = "check",
    ) -> list[CallResult]:
        """Run ``entry(argument)`` of ``sources[key]`` for each ``(key, argument)``.

        Each source is compiled once per batch (and cached in the worker); each call
        gets fresh module globals.  Returns one ``CallResult`` per call, in order.
        Arguments must be picklable plain data; the same object passed to several
        calls is sent once.
        """
        if not isinstance(entry, str) or not entry.isidentifier() or entry.startswith("_"):
            raise ValueError(f"invalid entry name {entry!r}")
        for key, _ in calls:
            if key not in sources:
                raise KeyError(f"call references unknown source {key!r}")
            if not isinstance(sources[key], str):
                raise TypeError(f"source {key!r} is not a str")
        with self._lock:
            self._check_open()
            return self._evaluate(sources, calls, entry)

    # -- internals -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")

    def _evaluate(self, sources: Mapping[str, str], calls: Sequence[tuple[str, object]], entry: str) -> list[CallResult]:
        results: list[CallResult | None] = [None] * len(calls)
        src_index: dict[str, int] = {}
        src_texts: list[str] = []
        src_reject: list[CallResult | None] = []
        arg_index: dict[int, int] = {}
        args: list[object] = []  # distinct argument objects (id() keys stay valid while we hold them)
        call_src: list[int] = [0] * len(calls)
        call_arg: list[int] = [0] * len(calls)
        pending: list[int] = []
        for i, (key, arg) in enumerate(calls):
            si = src_index.get(key)
            if si is None:
                si = src_index[key] = len(src_texts)
                text = sources[key]
                src_texts.append(text)
                src_reject.append(self._static_reject(text))
            call_src[i] = si
            if src_reject[si] is not None:
                rej = src_reject[si]
                results[i] = CallResult(False, None, rej.error_code, rej.error, 0.0)
                continue
            ai = arg_index.get(id(arg))
            if ai is None:
                ai = arg_index[id(arg)] = len(args)
                args.append(arg)
            call_arg[i] = ai
            pending.append(i)
        if pending:
            # Bundles are built per request (a job's share of the calls), on first use, and reused by re-runs.
            bundles: dict[tuple[int, ...], tuple[bytes, bool]] = {}
            self._dispatch(pending, src_texts, args, bundles, call_src, call_arg, entry, results)
        return [r if r is not None else CallResult(False, None, "crash", "no result", 0.0) for r in results]

    @staticmethod
    def _bundle(args: Sequence[object], used: Sequence[int], ids: Sequence[int], call_arg: Sequence[int]) -> tuple[bytes, bool]:
        """The arguments ``args[a] for a in used`` in one pickle (records shared between arguments, e.g. the
        untouched part of several trajectories' final states, are sent and decoded once), and whether it is
        plain data (only then may the worker share decoded arguments). ``ids``/``call_arg`` name the call
        whose argument cannot be pickled."""
        objs = [args[a] for a in used]
        try:
            return _plain_dumps(objs), True
        except Exception:  # noqa: BLE001 - not plain data: still fine, each call gets its own copy
            pass
        try:
            return pickle.dumps(objs, protocol=5), False
        except Exception as exc:
            bad = next((c for c in ids if not _picklable(args[call_arg[c]])), None)
            where = f"argument of call {bad}" if bad is not None else "an argument"
            raise TypeError(f"{where} is not picklable plain data: {exc}") from exc

    def _static_reject(self, text: str) -> CallResult | None:
        if not self.static_policy or _text_only_clean(text):
            return None
        verdict = _analyze(text)
        if verdict.compile_error is not None:
            return CallResult(False, None, "compile_error", verdict.compile_error[:MAX_MESSAGE_CHARS])
        if verdict.violations:
            msg = "; ".join(verdict.violations[:5])
            if len(verdict.violations) > 5:
                msg += f"; ... ({len(verdict.violations)} violations)"
            return CallResult(False, None, "forbidden", msg[:MAX_MESSAGE_CHARS])
        return None

    def _chunks(self, pending: list[int]) -> list[list[int]]:
        # Splitting only pays when each worker gets a reasonable amount of work.
        n = max(1, min(len(self._workers), len(pending) // 16))
        size = -(-len(pending) // n)
        return [pending[k : k + size] for k in range(0, len(pending), size)]

    def _grace(self) -> float:
        return 0.5 + 0.25 * self.limits.call_timeout_s

    def _dispatch(
        self,
        pending: list[int],
        src_texts: list[str],
        args: list[object],
        bundles: dict[tuple[int, ...], tuple[bytes, bool]],
        call_src: list[int],
        call_arg: list[int],
        entry: str,
        results: list[CallResult | None],
    ) -> None:
        active: dict[int, tuple[_Worker, _Job]] = {}  # worker slot -> job
        try:
            self._dispatch_loop(pending, src_texts, args, bundles, call_src, call_arg, entry, results, active)
        except BaseException:
            # Interrupted (KeyboardInterrupt, worker that cannot start...): a late reply
            # must never be read as the answer to the next batch.
            for w, _ in active.values():
                w.kill()
            raise

    def _dispatch_loop(
        self,
        pending: list[int],
        src_texts: list[str],
        args: list[object],
        bundles: dict[tuple[int, ...], tuple[bytes, bool]],
        call_src: list[int],
        call_arg: list[int],
        entry: str,
        results: list[CallResult | None],
        active: dict[int, tuple[_Worker, _Job]],
    ) -> None:
        lim = self.limits
        queue: deque[list[int]] = deque(self._chunks(pending))
        attempts: dict[int, int] = {}
        kills: dict[int, tuple[int, str, str]] = {}  # source -> (workers its calls stopped in this request, last code, message)
        while queue or active:
            for slot, w in enumerate(self._workers):
                if slot in active or not queue:
                    continue
                ids = queue.popleft()
                job = self._start(w, ids, src_texts, args, bundles, call_src, call_arg, entry)
                if job is None:  # could not even deliver the request: retry elsewhere
                    self._requeue(ids, queue, attempts, results, "worker unavailable")
                    continue
                active[slot] = (w, job)
            if not active:
                continue
            # Wait for replies, but never past the earliest backstop deadline.
            now = time.monotonic()
            poller = select.poll()
            wait = 1.0
            for w, job in active.values():
                poller.register(w.resp_r, select.POLLIN)
                wait = min(wait, self._deadline(w, job) - now)
            if wait > 0:
                poller.poll(int(wait * 1000) + 1)
            for slot, (w, job) in list(active.items()):
                try:
                    frame = w.take_frame(256 + len(job.calls) * (MAX_MESSAGE_CHARS * 6 + 128), len(job.calls) * (lim.max_result_bytes + 64))
                except ValueError as exc:
                    del active[slot]
                    self._protocol_error(w, job, results, str(exc))
                    continue
                if frame is not None:
                    del active[slot]
                    if not self._accept(w, job, frame, results):
                        continue
                elif w.eof:  # EOF only once the worker is gone and its output drained
                    del active[slot]
                    self._salvage(w, job, "died", queue, attempts, results, call_src, kills)
                elif time.monotonic() > self._deadline(w, job):
                    # Re-read: only kill when the same call is still overdue.
                    if time.monotonic() > self._deadline(w, job):
                        del active[slot]
                        self._salvage(w, job, "deadline", queue, attempts, results, call_src, kills)

    def _start(self, w: _Worker, ids: list[int], src_texts: list[str], args: list[object],
               bundles: dict[tuple[int, ...], tuple[bytes, bool]], call_src: list[int], call_arg: list[int], entry: str) -> _Job | None:
        lim = self.limits
        try:
            w.ensure_ready()
        except SandboxError:
            # One immediate retry: a fresh spawn normally succeeds; a second failure is
            # an infrastructure problem the caller must see.
            w.kill()
            w.ensure_ready()
        self._seq = (self._seq + 1) & 0x7FFFFFFF or 1
        local_src: dict[int, int] = {}
        local_arg: dict[int, int] = {}
        srcs: list[str] = []
        pairs: list[tuple[int, int]] = []
        for c in ids:
            s = local_src.setdefault(call_src[c], len(local_src))
            if s == len(srcs):
                srcs.append(src_texts[call_src[c]])
            pairs.append((s, local_arg.setdefault(call_arg[c], len(local_arg))))
        used = tuple(local_arg)  # global argument indices in local order
        bundle = bundles.get(used)
        if bundle is None:
            bundle = bundles[used] = self._bundle(args, used, ids, call_arg)
        blob, plain = bundle
        payload = pickle.dumps(
            (self._seq, entry, lim.call_timeout_s, lim.cpu_seconds, lim.max_result_bytes, self.copy_arguments, plain, srcs, blob, pairs),
            protocol=5,
        )
        job = _Job(self._seq, list(ids), list(local_src))
        job.sent_at = time.monotonic()
        # Whole-job cap: every call and compile may take its full timeout, plus transfer.
        job.budget_s = (len(ids) + len(srcs)) * (lim.call_timeout_s + self._grace()) + 10.0 + len(payload) / 50e6
        if not w.send(payload, job.sent_at + 10.0 + len(payload) / 50e6):
            w.kill()
            return None
        return job

    def _deadline(self, w: _Worker, job: _Job) -> float:
        hard = job.sent_at + job.budget_s
        seq, idx, start = w.progress()
        if seq != job.seq or idx == _IDLE:
            # Not started yet (reading the request) or writing the reply.
            return min(hard, max(job.sent_at, start if seq == job.seq else 0.0) + 10.0 + self._grace())
        return min(hard, start + self.limits.call_timeout_s + self._grace())

    def _accept(self, w: _Worker, job: _Job, frame: tuple[bytes, bytes], results: list[CallResult | None]) -> bool:
        header, values = frame
        try:
            hdr = json.loads(header)
            if not isinstance(hdr, dict) or hdr.get("seq") != job.seq:
                raise ValueError("reply for another batch")
            rows = hdr.get("r")
            if not isinstance(rows, list) or len(rows) != len(job.calls):
                raise ValueError("wrong number of results")
            # Rows are validated first; values (comma-joined JSON texts, one per "ok"
            # row) are then decoded in one json.loads, or one by one if that fails.
            spans: list[tuple[int, int]] = []
            offset = 0
            for row in rows:
                if not (isinstance(row, list) and len(row) == 4):
                    raise ValueError("malformed result row")
                code, msg, secs, vlen = row
                if not isinstance(secs, (int, float)) or not isinstance(vlen, int) or vlen < 0:
                    raise ValueError("malformed result row")
                if msg is not None and not isinstance(msg, str):
                    raise ValueError("malformed message")
                if code == "ok":
                    if spans:
                        offset += 1  # separator
                    spans.append((offset, offset + vlen))
                    offset += vlen
                elif code not in ERROR_CODES or vlen != 0:
                    raise ValueError(f"unknown result code {str(code)[:40]!r}")
            if offset != len(values):
                raise ValueError("value section length mismatch")
            decoded: list[Any] | None = None
            if spans:
                try:
                    decoded = json.loads(b"[" + values + b"]")
                    if not isinstance(decoded, list) or len(decoded) != len(spans):
                        decoded = None
                except (ValueError, RecursionError):
                    decoded = None
            parsed: list[CallResult] = []
            k = 0
            for code, msg, secs, _ in rows:
                if code != "ok":
                    parsed.append(CallResult(False, None, code, (msg or "")[:MAX_MESSAGE_CHARS], float(secs)))
                    continue
                if decoded is not None:
                    parsed.append(CallResult(True, decoded[k], None, None, float(secs)))
                else:
                    a, b = spans[k]
                    try:
                        parsed.append(CallResult(True, json.loads(values[a:b]), None, None, float(secs)))
                    except (ValueError, RecursionError):
                        parsed.append(CallResult(False, None, "bad_return", "value could not be decoded (nested too deeply?)", float(secs)))
                k += 1
        except (ValueError, RecursionError, TypeError) as exc:
            self._protocol_error(w, job, results, str(exc))
            return False
        for c, res in zip(job.calls, parsed):
            results[c] = res
        t = hdr.get("t")
        if isinstance(t, list) and len(t) == 6 and all(type(x) in (int, float) and 0 <= x < 1e9 for x in t):
            st = self.stats
            st["batches"] += 1
            st["calls"] += len(job.calls)
            st["compile_s"] += t[0]
            st["compiled"] += t[1]
            st["decode_s"] += t[2]
            st["shared_calls"] += t[3]
            st["rerun_calls"] += t[4]
            st["instantiated"] += t[5]
        if hdr.get("recycle") or w.buf:
            # Timeout/memory/violation/taint: the worker may be in a weird state.
            w.kill()
            w.spawn()
        return True

    def _protocol_error(self, w: _Worker, job: _Job, results: list[CallResult | None], why: str) -> None:
        # Garbage on the pipe means the worker is broken or compromised; nothing it
        # said about this batch can be attributed, so every call of the job is a crash.
        w.kill()
        w.spawn()
        for c in job.calls:
            results[c] = CallResult(False, None, "crash", f"worker protocol error: {why}"[:MAX_MESSAGE_CHARS], 0.0)

    def _requeue(self, ids: list[int], queue: deque[list[int]], attempts: dict[int, int], results: list[CallResult | None], why: str) -> None:
        again = []
        for c in ids:
            attempts[c] = attempts.get(c, 0) + 1
            if attempts[c] > 3:  # bounded: a call that keeps killing workers is a crash
                results[c] = CallResult(False, None, "crash", f"worker died repeatedly ({why})"[:MAX_MESSAGE_CHARS], 0.0)
            else:
                again.append(c)
        if again:
            queue.appendleft(again)

    def _salvage(self, w: _Worker, job: _Job, reason: str, queue: deque[list[int]], attempts: dict[int, int],
                 results: list[CallResult | None], call_src: list[int], kills: dict[int, tuple[int, str, str]]) -> None:
        """Worker died or overran: blame the call it was running, re-run the rest. The rest are not at fault:
        with a culprit found they are re-run as often as it takes (each death settles at least one call),
        otherwise each re-run counts against them. A checker that stopped the worker twice in one request
        has its other calls settled the same way without running them (a checker hanging in C on every
        trajectory would otherwise cost a worker and a grace period per call)."""
        seq, idx, start = w.progress()
        now = time.monotonic()
        rc = w.kill()
        w.spawn()
        culprits: list[int] = []
        where = "while idle"
        if seq == job.seq and 0 <= idx < len(job.calls):
            culprits = [job.calls[idx]]
            where = "while running this call"
        elif seq == job.seq and idx != _IDLE and 0 <= -idx - 1 < len(job.src_ids):
            gsrc = job.src_ids[-idx - 1]
            culprits = [c for c in job.calls if call_src[c] == gsrc]
            where = "while compiling this source"
        if reason == "deadline":
            code = "timeout"
            msg = f"wall-clock backstop: exceeded {self.limits.call_timeout_s:g}s (worker killed {where})"
        elif rc == -signal.SIGXCPU:
            code = "timeout"
            msg = f"CPU limit of {self.limits.cpu_seconds:g}s exceeded {where} (RLIMIT_CPU backstop)"
        else:
            code = "crash"
            msg = f"worker died ({_signal_name(rc)}) {where}"
        for c in culprits:
            results[c] = CallResult(False, None, code, msg, max(0.0, now - start) if start else 0.0)
        blamed = set(culprits)
        for src in {call_src[c] for c in culprits}:
            kills[src] = (kills.get(src, (0, "", ""))[0] + 1, code, msg)
        rest = []
        for c in job.calls:
            if c in blamed:
                continue
            n, last_code, last_msg = kills.get(call_src[c], (0, "", ""))
            if n >= 2:
                results[c] = CallResult(False, None, last_code,
                                        f"not run: this checker stopped the worker twice in this batch (last: {last_msg})"[:MAX_MESSAGE_CHARS], 0.0)
            else:
                rest.append(c)
        if rest and culprits:
            queue.appendleft(rest)
        elif rest:
            self._requeue(rest, queue, attempts, results, msg)


# --------------------------------------------------------------------------------------
# Worker side (runs as ``python -S -s -B sandbox.py --cowork-sandbox-worker ...``)
# --------------------------------------------------------------------------------------


class _PolicyViolation(BaseException):
    """Raised by runtime guards; BaseException so ``except Exception`` can't eat it."""


class _Timeout(BaseException):
    """Raised inside checker code by the SIGALRM handler."""


class _State:
    """Mutable worker state consulted by the audit hook and signal handler."""

    __slots__ = ("strict", "armed", "timed_out", "violation", "exec_code", "codegen", "introspect", "decimal_used", "recode")

    def __init__(self) -> None:
        self.strict = False  # untrusted code may be on the stack
        self.armed = False  # per-call timer active
        self.timed_out = False
        self.violation: str | None = None  # sticky per call
        self.exec_code: object = None  # the one code object exec() may run right now
        self.codegen = False  # inside our namedtuple wrapper
        self.introspect = False  # our own traceback walk
        self.decimal_used = True  # a checker imported decimal: reset its context
        self.recode: object = None  # the bytecode the worker itself is giving new constants (skeletons)


class _DiscardWriter:
    """sys.stdout/sys.stderr replacement: output is dropped, never reaches a pipe."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


_ALWAYS_BLOCKED_EVENTS = frozenset(
    {
        "open", "subprocess.Popen", "sys.addaudithook", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "sys._current_exceptions", "sys.setrecursionlimit",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "code.__new__",
        "function.__new__", "builtins.input", "builtins.breakpoint", "pdb.Pdb",
        "webbrowser.open", "mmap.__new__", "resource.prlimit", "signal.pthread_kill",
        "sys.set_asyncgen_hooks_firstiter", "sys.set_asyncgen_hooks_finalizer",
        "sys.excepthook", "sys.unraisablehook", "setopencmd", "glob.glob", "glob.glob/2",
    }
)
_ALWAYS_BLOCKED_PREFIXES = (
    "os.", "socket.", "subprocess.", "ctypes.", "shutil.", "tempfile.", "http.",
    "urllib.", "ftplib.", "smtplib.", "imaplib.", "poplib.", "nntplib.", "telnetlib.",
    "sqlite3.", "fcntl.", "syslog.", "winreg.", "msvcrt.", "_winapi.", "pty.",
)
_STRICT_BLOCKED_EVENTS = frozenset(
    {
        "compile", "exec", "import", "object.__getattr__", "object.__setattr__",
        "object.__delattr__", "sys._getframe", "marshal.loads", "marshal.load",
        "marshal.dumps", "marshal.dump", "pickle.find_class", "resource.setrlimit",
        "array.__new__",
    }
)

# x86_64 syscall numbers that fail with EPERM once the filter is installed.
_DENIED_SYSCALLS_X86_64 = (
    # processes / signals / debugging
    56, 57, 58, 59, 322, 435, 62, 200, 234, 129, 297, 101, 310, 311, 434, 424, 438, 440,
    448, 312, 109, 112,
    # network
    41, 53, 42, 43, 288, 49, 50, 44, 45, 46, 47, 307, 299, 48, 54, 55,
    # filesystem (any open, any modification)
    2, 257, 437, 85, 304, 303, 76, 77, 82, 264, 316, 83, 258, 84, 86, 265, 87, 263, 88,
    266, 90, 91, 268, 92, 93, 94, 260, 133, 259, 80, 81, 161, 132, 235, 280, 261, 188,
    189, 190, 197, 198, 199, 285, 326, 40, 275, 276, 278, 253, 294, 254, 300, 301, 319,
    447, 240, 241, 29, 30, 31, 68, 64, 425, 426, 427, 134, 163, 162, 306, 206,
    # system administration / privilege / kernel attack surface
    165, 166, 155, 272, 308, 167, 168, 169, 170, 171, 175, 313, 176, 174, 246, 320, 321,
    298, 323, 250, 248, 249, 135, 172, 173, 154, 179, 443, 164, 227, 305, 159, 156, 103,
    153, 212, 180, 428, 429, 430, 431, 432, 433, 442, 105, 106, 113, 114, 117, 119, 116,
    122, 123, 126, 157, 317, 256, 279, 237, 238, 450, 141, 144, 142, 314, 203, 251,
)


def _install_seccomp(ctypes: Any, libc: Any) -> bool:
    """Deny dangerous syscalls with EPERM (x86_64 only); returns True when active."""
    if os.uname().machine != "x86_64":
        return False
    denied = sorted(set(_DENIED_SYSCALLS_X86_64))
    n = len(denied)
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny, kill = 0x7FFF0000, 0x00050000 | 1, 0x80000000  # ERRNO(EPERM)
    insns = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, 0xC000003E),  # AUDIT_ARCH_X86_64
        (ret, 0, 0, kill),  # other ABIs (i386 int 0x80) have other numbers: kill
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, n + 1, 0, 0x40000000),  # x32 ABI numbers: deny
    ]
    for i, nr in enumerate(denied):
        insns.append((jeq, n - i, 0, nr))
    insns += [(ret, 0, 0, allow), (ret, 0, 0, deny)]

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    arr = (SockFilter * len(insns))(*[SockFilter(*ins) for ins in insns])
    prog = SockFprog(len(insns), arr)
    addr = ctypes.cast(ctypes.pointer(prog), ctypes.c_void_p).value
    return libc.prctl(22, 2, addr, 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


class _WorkerRuntime:
    """Everything the worker needs; built once at startup before hardening."""

    def __init__(self, req_fd: int, resp_fd: int, shm_fd: int, memory_mb: int) -> None:
        import mmap

        self.req_fd = req_fd
        self.resp_fd = resp_fd
        self.shm = mmap.mmap(shm_fd, _PROGRESS.size)
        os.close(shm_fd)
        self.memory_mb = memory_mb
        self.st = _State()
        self.recycle = False
        self.code_cache = _TextCache(_CODE_CACHE_ENTRIES, _CODE_CACHE_CHARS)  # source -> (code objects, mutation_free)
        self.compiler = _CheckerCompiler(self.st)
        self.decode_s = 0.0  # argument decoding, private copies and the tripwire (reported to the parent)
        self.layers: dict[str, Any] = {}
        self.root_listing: list[str] | None = None

    # -- startup -----------------------------------------------------------------------
    def preload(self) -> None:
        """Import everything untrusted code may reach, so nothing is loaded later
        (after chroot/seccomp a lazy import or file read would fail)."""
        import abc
        import collections.abc
        import datetime
        import decimal
        import encodings.ascii
        import encodings.latin_1
        import encodings.utf_16
        import encodings.utf_32
        import encodings.utf_8_sig
        import encodings.cp1252
        import encodings.unicode_escape
        import encodings.raw_unicode_escape
        import fractions
        import functools
        import itertools
        import math
        import operator
        import re
        import statistics
        import string
        import _strptime  # noqa: F401  (lazy import of datetime.strptime)
        import heapq  # noqa: F401  (lazy import of Counter.most_common)
        import types  # noqa: F401
        import weakref  # noqa: F401  (lazy import of functools.singledispatch)
        import ctypes  # noqa: F401  (used by harden(); must load before chroot)

        # Warm lazy paths: strptime caches, timezone (TZ=UTC0 needs no file), codecs.
        datetime.datetime.strptime("2024-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
        datetime.datetime.now().astimezone().strftime("%c %Z")
        time.localtime()
        "x".encode("utf-16").decode("utf-16")
        re.compile(r"(?i)\w+\s*\d").findall("Ab 1")
        statistics.stdev([1.0, 2.0, 4.0])
        statistics.median([3, 1, 2])
        float(fractions.Fraction(1, 3) + int(decimal.Decimal("1.1").to_integral_value()))
        json.loads(json.dumps({"a": [1.5, None, True]}))
        self.abc = abc
        self.decimal = decimal
        self.pristine_decimal = decimal.getcontext().copy()

    def build_runtime(self) -> None:
        """Curated builtins, module proxies and frozen stdlib classes (layer 2)."""
        import builtins
        import collections
        import decimal
        import operator
        import types

        st = self.st
        safe_names = [
            "abs", "aiter", "all", "anext", "any", "ascii", "bin", "bool", "bytearray",
            "bytes", "callable", "chr", "classmethod", "complex", "dict", "dir", "divmod",
            "enumerate", "filter", "float", "format", "frozenset", "hash", "hex", "id",
            "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min",
            "next", "object", "oct", "ord", "pow", "property", "range", "repr",
            "reversed", "round", "set", "slice", "sorted", "staticmethod", "str", "sum",
            "super", "tuple", "type", "zip", "True", "False", "None", "Ellipsis",
            "NotImplemented",
        ]
        safe: dict[str, Any] = {n: getattr(builtins, n) for n in safe_names if hasattr(builtins, n)}
        for n in dir(builtins):
            v = getattr(builtins, n)
            if isinstance(v, type) and issubclass(v, BaseException):
                safe[n] = v

        def violation(msg: str) -> _PolicyViolation:
            if st.violation is None:
                st.violation = msg
            return _PolicyViolation(msg)

        def _print(*args: object, **kwargs: object) -> None:
            return None  # output is discarded: never the IPC channel, never unbounded

        def _hasattr(obj: object, name: str) -> bool:
            if _unsafe_attr_name(name):
                raise violation(f"hasattr with name {name!r} is not allowed")
            return hasattr(obj, name)

        proxies: dict[str, Any] = {}

        internal: dict[str, Any] = {}

        def _import(name: str, globals: object = None, locals: object = None, fromlist: Sequence[str] = (), level: int = 0) -> Any:
            # C extensions (``_datetime``) import through the *current frame's*
            # builtins, i.e. through us; they get minimal proxies of what they need.
            if level == 0 and isinstance(name, str) and name in internal:
                return internal[name]
            if level != 0 or not isinstance(name, str) or name not in proxies:
                raise violation(f"import of module {name!r} is not allowed")
            if name == "decimal":
                st.decimal_used = True
            if fromlist:
                return proxies[name]
            return proxies[name.partition(".")[0]]

        real_attrgetter, real_methodcaller = operator.attrgetter, operator.methodcaller

        def attrgetter(*names: str) -> Any:
            for n in names:
                if _unsafe_attr_name(n):
                    raise violation(f"operator.attrgetter({n!r}) is not allowed")
            return real_attrgetter(*names)

        def methodcaller(name: str, /, *args: object, **kwargs: object) -> Any:
            if _unsafe_attr_name(name) or "." in name:
                raise violation(f"operator.methodcaller({name!r}) is not allowed")
            return real_methodcaller(name, *args, **kwargs)

        real_namedtuple = collections.namedtuple

        def namedtuple(typename: str, field_names: Any, *, rename: bool = False, defaults: Any = None, module: object = None) -> Any:
            # Normalise inputs *before* enabling codegen so no user code runs while the
            # audit hook tolerates namedtuple's internal eval().
            typename = str.__str__(str(typename))
            if isinstance(field_names, str):
                fields: Any = str.__str__(field_names)
            else:
                fields = [str.__str__(str(f)) for f in field_names]
            defaults = None if defaults is None else tuple(defaults)
            rename = bool(rename)
            st.codegen = True
            try:
                return real_namedtuple(typename, fields, rename=rename, defaults=defaults, module=CHECKER_MODULE_NAME)
            finally:
                st.codegen = False

        overrides = {
            ("operator", "attrgetter"): attrgetter,
            ("operator", "methodcaller"): methodcaller,
            ("collections", "namedtuple"): namedtuple,
        }
        excluded = {
            ("string", "Formatter"),  # get_field() walks attributes from a string
            ("decimal", "DefaultContext"),  # mutable process-wide templates
            ("decimal", "BasicContext"),
            ("decimal", "ExtendedContext"),
        }

        class _ModuleProxyType(type):
            """Read-only stand-in for a module: public names only, no assignment."""

            def __setattr__(cls, name: str, value: object) -> None:
                raise AttributeError(f"module {cls.__name__!r} is read-only in the sandbox")

            def __delattr__(cls, name: str) -> None:
                raise AttributeError(f"module {cls.__name__!r} is read-only in the sandbox")

            def __repr__(cls) -> str:
                return f"<sandboxed module {cls.__name__!r}>"

        exposed: list[object] = []
        for modname in sorted(ALLOWED_MODULES | ALLOWED_SUBMODULES, key=lambda m: -m.count(".")):
            mod = sys.modules[modname]
            public = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
            attrs: dict[str, Any] = {}
            for n in public:
                if n.startswith("_") or (modname, n) in excluded or not hasattr(mod, n):
                    continue
                v = overrides.get((modname, n), getattr(mod, n))
                if isinstance(v, types.ModuleType) or type(v) in (list, dict, set, bytearray):
                    continue  # no submodules (except allowlisted) and no shared mutable containers
                if isinstance(v, decimal.Context):
                    continue
                attrs[n] = staticmethod(v)  # class access returns v itself, whatever v is
                exposed.append(v)
            for sub in ALLOWED_SUBMODULES:
                parent, _, child = sub.rpartition(".")
                if parent == modname:
                    attrs[child] = staticmethod(proxies[sub])
            attrs["__all__"] = tuple(sorted(k for k in attrs if not k.startswith("_")))
            proxies[modname] = _ModuleProxyType(modname, (), attrs)

        import _strptime

        internal["time"] = _ModuleProxyType("time", (), {n: staticmethod(getattr(time, n)) for n in dir(time) if not n.startswith("_")})
        internal["_strptime"] = _ModuleProxyType(
            "_strptime", (), {n: staticmethod(getattr(_strptime, n)) for n in ("_strptime_datetime", "_strptime_time", "_strptime")}
        )
        internal["datetime"] = proxies["datetime"]
        safe["print"] = _print
        safe["hasattr"] = _hasattr
        safe["__import__"] = _import
        safe["__build_class__"] = builtins.__build_class__
        self.builtins = safe
        self.proxies = proxies

        # Freeze every Python class reachable from what we expose (incl. bases and
        # metaclasses) so checkers cannot monkeypatch shared classes.
        todo: list[type] = [_ModuleProxyType, *proxies.values(), *internal.values()]
        for v in exposed:
            todo.append(v if isinstance(v, type) else type(v))
        seen: set[int] = set()
        classes: list[type] = []
        while todo:
            cls = todo.pop()
            if id(cls) in seen:
                continue
            seen.add(id(cls))
            classes.append(cls)
            todo.extend(cls.__mro__)
            todo.append(type(cls))
            for val in vars(cls).values():
                if isinstance(val, type):
                    todo.append(val)
        self.frozen = 0
        self.unfrozen: list[tuple[type, dict[str, Any]]] = []
        for cls in classes:
            if cls.__flags__ & (1 << 9) and not cls.__flags__ & (1 << 8):  # HEAPTYPE, not IMMUTABLE
                if self._freeze(cls):
                    self.frozen += 1
                else:  # fall back to detecting changes between batches
                    self.unfrozen.append((cls, dict(vars(cls))))
        # Instances with a __dict__ (e.g. re.RegexFlag members) are checked between batches.
        self.instance_snapshots = [
            (v, dict(v.__dict__)) for v in exposed if not isinstance(v, (type, types.FunctionType, types.BuiltinFunctionType)) and isinstance(getattr(v, "__dict__", None), dict)
        ]

    @staticmethod
    def _freeze(cls: type) -> bool:
        try:
            import ctypes

            flags = ctypes.c_ulong.from_address(id(cls) + 21 * ctypes.sizeof(ctypes.c_void_p))
            if flags.value != cls.__flags__:  # layout is not what we expect: don't poke
                return False
            flags.value |= 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE
            return bool(cls.__flags__ & (1 << 8))
        except Exception:
            return False

    def harden(self) -> None:
        """Layer 3: namespaces, chroot, rlimits, privileges, seccomp, audit hook."""
        import ctypes
        import gc
        import resource

        layers = self.layers
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        libc.unshare.argtypes = [ctypes.c_int]
        is_root = os.geteuid() == 0

        # Empty network namespace: even a full escape has no interface but a down lo.
        before = after = None
        try:
            before = os.readlink("/proc/self/ns/net")
            if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
                after = os.readlink("/proc/self/ns/net")
        except OSError:
            pass
        layers["network_namespace"] = bool(before and after and before != after)

        # chroot into the private empty temp dir: no host file is even nameable.
        layers["chroot"] = False
        if is_root:
            try:
                os.chroot(os.getcwd())
                os.chdir("/")
                layers["chroot"] = True
                self.root_listing = sorted(os.listdir("/"))  # for Sandbox.isolation()
            except OSError:
                pass

        RLIM = resource.RLIM_INFINITY
        limits = {
            resource.RLIMIT_CORE: (0, 0),
            resource.RLIMIT_FSIZE: (0, 0),  # no file can grow (writes fail with EFBIG)
            resource.RLIMIT_NOFILE: (max(self.req_fd, self.resp_fd, 2) + 1,) * 2,  # no new fds
            resource.RLIMIT_AS: (self.memory_mb * 1024 * 1024,) * 2,
            resource.RLIMIT_CPU: (RLIM, RLIM),  # soft limit set per batch, renewed as calls complete
        }
        applied = {}
        for res, val in limits.items():
            try:
                resource.setrlimit(res, val)
                applied[res] = True
            except (ValueError, OSError):
                applied[res] = False
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death

        layers["dropped_privileges"] = False
        if is_root:
            try:
                os.setgroups([])
                os.setgid(_NOBODY)
                os.setuid(_NOBODY)
                layers["dropped_privileges"] = os.getuid() == _NOBODY and os.geteuid() == _NOBODY
            except OSError:
                pass
        try:  # after the uid change: NPROC is not enforced for root
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
            applied[resource.RLIMIT_NPROC] = True
        except (ValueError, OSError):
            applied[resource.RLIMIT_NPROC] = False
        layers["rlimits"] = {
            "AS": applied[resource.RLIMIT_AS], "CPU": applied[resource.RLIMIT_CPU],
            "NPROC": applied[resource.RLIMIT_NPROC], "FSIZE": applied[resource.RLIMIT_FSIZE],
            "NOFILE": applied[resource.RLIMIT_NOFILE], "CORE": applied[resource.RLIMIT_CORE],
        }

        parent = os.getppid()
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG (after setuid, which clears it)
        if os.getppid() != parent:
            os._exit(0)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE=0: no ptrace / core / /proc/pid/mem
        layers["no_new_privs"] = libc.prctl(38, 1, 0, 0, 0) == 0
        try:
            layers["seccomp"] = _install_seccomp(ctypes, libc)
        except Exception:
            layers["seccomp"] = False

        sys.stdout = _DiscardWriter()  # type: ignore[assignment]
        sys.stderr = _DiscardWriter()  # type: ignore[assignment]
        sys.stdin = None  # type: ignore[assignment]
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, self._on_alarm)

        # Everything allocated so far is permanent: later full collections only scan
        # objects created by batches, so they stay cheap.
        gc.collect()
        gc.freeze()
        gc.disable()
        self.gc = gc
        self.resource = resource
        sys.addaudithook(self._make_audit_hook())
        layers["audit_hook"] = True
        layers["frozen_types"] = self.frozen

    def _make_audit_hook(self) -> Any:
        st = self.st
        always = _ALWAYS_BLOCKED_EVENTS
        prefixes = _ALWAYS_BLOCKED_PREFIXES
        strict_events = _STRICT_BLOCKED_EVENTS

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if event == "code.__new__" and st.recode is not None and not st.strict and args and args[0] is st.recode:
                return  # the worker's own code.replace(co_consts=...) of bytecode it compiled itself
            if event in always or event.startswith(prefixes):
                blocked = True
            elif not st.strict or event not in strict_events:
                return
            elif event == "exec":
                blocked = not (args and args[0] is st.exec_code and st.exec_code is not None) and not st.codegen
            elif event in ("compile", "sys._getframe", "object.__setattr__"):
                blocked = not st.codegen
            elif event == "object.__getattr__":
                blocked = not st.introspect
            else:
                blocked = True
            if blocked:
                detail = f" ({args[0]!r})" if event in ("import", "open") and args and isinstance(args[0], str) else ""
                msg = f"runtime policy: audit event {event!r}{detail} is not allowed"
                if st.strict and st.violation is None:
                    st.violation = msg
                raise _PolicyViolation(msg)

        return hook

    def _on_alarm(self, signum: int, frame: Any) -> None:
        st = self.st
        if not st.armed:
            return
        st.timed_out = True
        # Only interrupt checker/stdlib code, never the worker's own bookkeeping; the
        # repeating timer catches the next moment checker code runs.
        if frame is not None and frame.f_globals is not _WORKER_GLOBALS:
            raise _Timeout()

    # -- serving -----------------------------------------------------------------------
    def send_hello(self) -> None:
        facts = {
            "hello": True,
            "pid": os.getpid(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "cwd": os.getcwd(),
            "root_listing": self.root_listing,
            "env_keys": sorted(os.environ),
            "layers": self.layers,
            "python": sys.version.split()[0],
        }
        self._write_frame(json.dumps(facts).encode(), b"")

    def _write_frame(self, header: bytes, values: bytes) -> None:
        data = memoryview(_RESP_HEADER.pack(len(header), len(values)) + header + values)
        while data:
            n = os.write(self.resp_fd, data)
            data = data[n:]

    def _read_exact(self, n: int) -> bytes | None:
        chunks = []
        while n:
            chunk = os.read(self.req_fd, min(n, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def serve(self) -> None:
        while True:
            head = self._read_exact(_REQ_HEADER.size)
            if head is None:
                return
            payload = self._read_exact(_REQ_HEADER.unpack(head)[0])
            if payload is None:
                return
            header, values = self._run_batch(pickle.loads(payload))
            self._write_frame(header, values)
            if self.recycle:
                return  # the parent replaces us

    def _compile(self, source: str) -> Any:
        """(code objects, mutation_free) for ``source`` (see ``_CheckerCompiler.compile_parts``), or the
        compile error as a str."""
        # Least recently used first out: sources shared by many environments (parameterless
        # safety checks, lax checks) stay compiled across batches while one-off sources pass.
        code = self.code_cache.take(source)
        if code is None:
            code = self.compiler.compile_parts(source)
            if isinstance(code, str):
                return code
        self.code_cache.put(source, code)
        return code

    def _run_batch(self, req: tuple[Any, ...]) -> tuple[bytes, bytes]:
        seq, entry, timeout, cpu_s, max_bytes, copy_args, plain, srcs, bundle, pairs = req
        progress = _PROGRESS.pack_into
        mono = time.monotonic
        self._cpu_budget(cpu_s)
        codes = []
        clock = time.perf_counter
        t_compile = clock()
        self.compiler.compiled = self.compiler.instantiated = 0
        for k, src in enumerate(srcs):
            progress(self.shm, 0, seq, -k - 1, mono())
            codes.append(self._compile(src))
        t_compile = clock() - t_compile
        token = self.abc.get_cache_token()
        # Arguments are decoded once per batch.  Calls whose code is mutation-free share them
        # (every call when copy_args is off); the others get a private copy each, serialized from
        # the pristine objects before any checker runs.
        t_decode = clock()
        bad_args = None
        try:
            args = pickle.loads(bundle)
        except Exception as exc:  # noqa: BLE001
            args, bad_args = None, f"argument could not be decoded ({type(exc).__name__})"
        share = [plain and not isinstance(c, str) and (not copy_args or c[1]) for c in codes]
        private: dict[int, tuple[Any, bytes]] = {}  # argument -> (loads, blob) of its private copies
        if args is not None:
            for s, a in pairs:
                if not share[s] and a not in private and not isinstance(codes[s], str):
                    private[a] = self._private_copy(args[a], plain)
        self.decode_s = clock() - t_decode
        sharers: list[int] = []
        out: list[tuple[str, str, float]] = []
        # Each checker (source) has ``cpu_s`` seconds of calls per batch: a slow one runs out of its own
        # budget (its later calls are timeouts) instead of the batch's, whose exhaustion killed the worker
        # and, on every re-run, the honest calls queued with it ("worker died repeatedly"). RLIMIT_CPU stays
        # the backstop for a call that escapes its timer: renewed as completed calls add up.
        spent = [0.0] * len(codes)
        since = 0.0
        for j, (s, a) in enumerate(pairs):
            progress(self.shm, 0, seq, j, mono())
            code = codes[s]
            if isinstance(code, str):
                out.append(("compile_error", code[:MAX_MESSAGE_CHARS], 0.0))
            elif args is None:
                out.append(("exception", bad_args or "", 0.0))
            elif spent[s] > cpu_s:
                out.append(("timeout", f"this checker's calls used up their CPU budget of {cpu_s:g}s per batch", 0.0))
            elif share[s]:
                sharers.append(j)
                out.append(self._run_call(code[0], entry, args[a], None, timeout, max_bytes))
            else:
                out.append(self._run_call(code[0], entry, private[a][1], private[a][0], timeout, max_bytes))
            secs = out[-1][2]
            spent[s] += secs
            since += secs
            if since > cpu_s / 4:
                self._cpu_budget(cpu_s)
                since = 0.0
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        # Tripwire: the shared arguments must pickle back to the very bytes they came from (the
        # plain pickler runs no code a checker defined and rejects objects it planted).  If a call
        # changed them anyway, every call that shared them is re-run on a private copy of the
        # pristine arguments, so no verdict depends on another call's writes.
        rerun = 0
        if sharers:
            t_decode = clock()
            try:
                intact = _plain_dumps(args) == bundle
            except Exception:  # noqa: BLE001 - e.g. an object a checker planted, or a cycle
                intact = False
            if not intact:
                self.recycle = True
                rerun = len(sharers)
                pristine = pickle.loads(bundle)
                for j in sharers:
                    s, a = pairs[j]
                    if a not in private:
                        private[a] = self._private_copy(pristine[a], plain)
                    progress(self.shm, 0, seq, j, mono())
                    out[j] = self._run_call(codes[s][0], entry, private[a][1], private[a][0], timeout, max_bytes)
                    since += out[j][2]
                    if since > cpu_s / 4:
                        self._cpu_budget(cpu_s)
                        since = 0.0
                signal.setitimer(signal.ITIMER_REAL, 0, 0)
            self.decode_s += clock() - t_decode
        args = None
        progress(self.shm, 0, seq, _IDLE, mono())
        rows: list[str] = []
        values: list[str] = []
        for status, text, secs in out:
            if status == "ok":
                rows.append(f'["ok",null,{secs!r},{len(text)}]')
                values.append(text)
            else:
                rows.append(json.dumps([status, text[:MAX_MESSAGE_CHARS], secs, 0]))
                if status in ("timeout", "memory", "forbidden", "crash"):
                    self.recycle = True
        if self._tainted(token):
            self.recycle = True
        header = '{"seq":%d,"recycle":%s,"t":[%r,%d,%r,%d,%d,%d],"r":[%s]}' % (
            seq, "true" if self.recycle else "false", t_compile, self.compiler.compiled, self.decode_s, len(sharers), rerun,
            self.compiler.instantiated, ",".join(rows))
        return header.encode("ascii"), ",".join(values).encode("ascii")

    def _cpu_budget(self, cpu_s: float) -> None:
        """RLIMIT_CPU: ``cpu_s`` more seconds from what the worker has used so far (the batch backstop)."""
        try:
            ru = self.resource.getrusage(self.resource.RUSAGE_SELF)
            used = ru.ru_utime + ru.ru_stime
            self.resource.setrlimit(self.resource.RLIMIT_CPU, (int(used + cpu_s) + 1, self.resource.RLIM_INFINITY))
        except (ValueError, OSError):
            pass

    def _tainted(self, token: object) -> bool:
        if self.abc.get_cache_token() != token:  # ABC.register() leaks into later calls
            return True
        for obj, snap in self.instance_snapshots:
            if obj.__dict__ != snap:
                return True
        for cls, snap in self.unfrozen:
            if dict(vars(cls)) != snap:
                return True
        return False

    @staticmethod
    def _private_copy(obj: Any, plain: bool) -> tuple[Any, bytes]:
        """``obj`` serialized once, for a fresh copy per call: marshal for plain data (faster both ways; it
        keeps shared sub-objects shared, as pickle does), pickle otherwise or when marshal refuses it."""
        if plain:
            try:
                return marshal.loads, marshal.dumps(obj, 4)
            except ValueError:  # nested deeper than marshal's limit
                pass
        return pickle.loads, pickle.dumps(obj, protocol=5)

    def _run_call(self, code: Any, entry: str, arg_src: Any, loads: Any, timeout: float, max_bytes: int) -> tuple[str, str, float]:
        """Run one call on ``loads(arg_src)``, a private copy, or on ``arg_src`` itself when ``loads`` is None."""
        st = self.st
        t_decode = time.perf_counter()
        try:
            arg = loads(arg_src) if loads is not None else arg_src
        except Exception as exc:
            return "exception", f"argument could not be decoded ({type(exc).__name__})", 0.0
        self.decode_s += time.perf_counter() - t_decode
        # Trusted objects (argument, batch state) leave the young generation, so the
        # post-call collect(0) only scans what checker code allocated.  Frozen objects
        # are still freed by refcounting.
        self.gc.freeze()
        g: dict[str, Any] = {"__builtins__": dict(self.builtins), "__name__": CHECKER_MODULE_NAME}
        if st.decimal_used:  # only checker code can change the thread's decimal context
            self.decimal.setcontext(self.pristine_decimal.copy())
            st.decimal_used = False
        gc_before = self.gc.get_count()[0]
        st.violation = None
        st.timed_out = False
        outcome: tuple[str, str]
        st.strict = True
        st.armed = True
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, timeout, _TICK_S)
        try:
            outcome = self._invoke(code, g, entry, arg, max_bytes)
        except BaseException as exc:  # noqa: BLE001 - everything the checker raises is a result
            try:
                outcome = self._classify(exc, timeout)
            except BaseException:  # noqa: BLE001 - hostile exception object
                outcome = ("exception", "unprintable exception")
        # Still armed and strict: dropping checker objects may run their finalizers.
        g.clear()
        g = arg = None  # type: ignore[assignment]
        try:
            if self.gc.get_count()[0] > gc_before:
                # Young generation only: cyclic garbage of this call (classes, frames)
                # dies here, under the policy and the timer, and stays cheap because
                # long-lived objects were frozen or promoted already.
                self.gc.collect(0)
        except BaseException:  # noqa: BLE001
            pass
        secs = time.perf_counter() - t0
        st.armed = False  # the timer itself is re-armed by the next call / stopped per batch
        st.strict = False
        st.exec_code = None
        if st.violation is not None:
            return "forbidden", st.violation, secs
        if st.timed_out or outcome[0] == "timeout":
            # The timer fired while armed: the call overran, even if it swallowed
            # the exception and returned something.
            return "timeout", f"call exceeded {timeout:g}s", secs
        return outcome[0], outcome[1], secs

    def _invoke(self, code: Any, g: dict[str, Any], entry: str, arg: Any, max_bytes: int) -> tuple[str, str]:
        st = self.st
        for part in code:
            st.exec_code = part  # the audit hook lets exec() run exactly this code object
            exec(part, g)
        fn = g.get(entry)
        if fn is None or not callable(fn):
            return "missing_entry", f"source defines no callable {entry!r}"
        value = fn(arg)
        return self._encode(value, max_bytes)

    @staticmethod
    def _reject(obj: object) -> None:
        raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")

    # The C encoder built once (JSONEncoder.encode rebuilds it on every call).
    # markers=None: cycles end in RecursionError -> bad_return, and no shared
    # state survives an interrupted encode.
    _C_ENCODE = staticmethod(
        json.encoder.c_make_encoder(None, _reject, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False)  # type: ignore[attr-defined]
        if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
        else None
    )
    _ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))

    def _encode(self, value: Any, max_bytes: int) -> tuple[str, str]:
        t = type(value)
        if t is bool:
            return "ok", "true" if value else "false"
        if value is None:
            return "ok", "null"
        if t is str and len(value) > max_bytes:
            return "output_too_large", f"returned a {len(value)}-character string (limit {max_bytes} bytes)"
        if (t is list or t is dict or t is tuple) and len(value) > max_bytes // 2:
            return "output_too_large", f"returned a {t.__name__} with {len(value)} items (limit {max_bytes} bytes)"
        try:
            enc = self._C_ENCODE
            text = "".join(enc(value, 0)) if enc is not None else self._ENCODER.encode(value)
        except (TypeError, ValueError, RecursionError, OverflowError) as exc:
            return "bad_return", f"return value is not JSON-serialisable: {str(exc)[:200]}"
        if len(text) > max_bytes:
            return "output_too_large", f"return value is {len(text)} bytes as JSON (limit {max_bytes})"
        return "ok", text

    def _classify(self, exc: BaseException, timeout: float) -> tuple[str, str]:
        if isinstance(exc, _Timeout):
            return "timeout", f"call exceeded {timeout:g}s"
        if isinstance(exc, _PolicyViolation):
            return "forbidden", str(exc)
        if isinstance(exc, MemoryError):
            return "memory", "MemoryError: memory limit exceeded"
        line = None
        self.st.introspect = True
        try:
            tb = exc.__traceback__
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == CHECKER_FILENAME:
                    line = tb.tb_lineno
                tb = tb.tb_next
        except BaseException:  # noqa: BLE001
            pass
        finally:
            self.st.introspect = False
        try:
            name = type(exc).__name__
            text = str(exc)
            # Exact str only: a str subclass could run checker code when sliced/formatted.
            name = name if type(name) is str else "Exception"
            text = text[:300] if type(text) is str else "<unprintable>"
        except BaseException:  # noqa: BLE001 - a hostile __str__ must not break us
            name, text = "Exception", "<unprintable>"
        where = f" (line {line})" if line else ""
        return "exception", f"{name}: {text}{where}" if text else f"{name}{where}"


_WORKER_GLOBALS = globals()


def _worker_main(argv: list[str]) -> None:
    here = os.path.dirname(_THIS_FILE)
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != here]
    import traceback  # before chroot: needed to report setup failures

    req_fd, resp_fd, shm_fd, memory_mb = (int(a) for a in argv[:4])
    # Renumber our pipes to 3 and 4 so RLIMIT_NOFILE=5 leaves no room for new fds.
    fds = []
    for fd in (req_fd, resp_fd, shm_fd):
        fds.append(os.dup(fd))
    for fd in {req_fd, resp_fd, shm_fd}:
        os.close(fd)
    for target, fd in zip((3, 4, 5), fds):
        if fd != target:
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
    req_fd, resp_fd, shm_fd = 3, 4, 5
    rt = _WorkerRuntime(req_fd, resp_fd, shm_fd, memory_mb)
    try:
        rt.preload()
        rt.build_runtime()
        rt.harden()
    except BaseException as exc:  # report instead of dying silently
        msg = "".join(traceback.format_exception(exc))[-2000:]
        try:
            rt._write_frame(json.dumps({"hello": False, "error": msg}).encode(), b"")
        finally:
            os._exit(3)
    rt.send_hello()
    try:
        rt.serve()
    except BaseException:  # noqa: BLE001 - the parent attributes the death via progress
        os._exit(4)
    os._exit(0)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == _WORKER_FLAG:
    _worker_main(sys.argv[2:])
