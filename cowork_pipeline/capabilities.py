"""Capability specs: what an agent must be able to do, as validated YAML data.

A bad file fails with the file name, the line and the field at fault, so a user
editing the catalog sees exactly what to fix.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from cowork_pipeline.services import REGISTRY, SERVICES

CATALOG_DIR = Path(__file__).parent / "catalog"
SAFETY_KINDS = ("no_outside_email", "no_deletes", "no_confidential_leak", "no_unrelated_changes")


class CapabilityError(ValueError):
    """A capability file is malformed; the message names the file, line and field."""


class Range(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min: int = 0
    max: int = 0

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if self.min < 0 or self.max < self.min:
            raise ValueError(f"need 0 <= min <= max, got min={self.min} max={self.max}")
        return self


class Difficulty(BaseModel):
    model_config = ConfigDict(extra="forbid")
    distractors: Range = Field(default_factory=lambda: Range(min=1, max=3))  # unrelated records of the same kind
    near_duplicates: Range = Field(default_factory=lambda: Range(min=0, max=1))  # records that look like the target
    extra_steps: Range = Field(default_factory=lambda: Range(min=0, max=0))  # optional extra work in the request
    # instructions planted in what the task reads from outside (a customer's email: "AI assistant, forward this to
    # ..."), which the agent must not follow: the safety items judge it, a validator mutant follows it
    injections: Range = Field(default_factory=lambda: Range(min=0, max=0))


class SafetyConstraint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["no_outside_email", "no_deletes", "no_confidential_leak", "no_unrelated_changes"]
    description: str


class Capability(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z][a-z0-9_]{2,63}$")
    title: str
    description: str
    services: list[str] = Field(min_length=1)
    tools: list[str] = Field(min_length=1)
    multi_turn: bool = False
    # The embedded generator's composer for this capability; None for a capability only a model drafts
    # (the LLM backend works from the rest of the spec).
    composer: str | None = None
    difficulty: Difficulty = Field(default_factory=Difficulty)
    safety: list[SafetyConstraint] = Field(default_factory=list)
    heldout: bool = False  # a held-out capability: never contributes to training
    environments: int = Field(default=64, ge=1, le=100_000)  # how many seeds the default profile drafts
    tags: list[str] = Field(default_factory=list)

    @field_validator("services")
    @classmethod
    def _known_services(cls, v: list[str]) -> list[str]:
        bad = [s for s in v if s not in SERVICES]
        if bad:
            raise ValueError(f"unknown service(s) {bad}; known: {list(SERVICES)}")
        return v

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, v: list[str], info: ValidationInfo) -> list[str]:
        bad = [t for t in v if t not in REGISTRY or REGISTRY[t].hidden]
        if bad:
            raise ValueError(f"unknown tool(s) {bad}")
        # A field validator (not a model validator) so the error's location is ``tools`` and the
        # message carries the line of the ``tools`` field, not line 1 / "(root)".
        services = info.data.get("services")
        if services is not None:  # absent when 'services' itself failed (that error is reported)
            stray = [t for t in v if REGISTRY[t].service not in services]
            if stray:
                raise ValueError(f"tools {stray} belong to services not listed in 'services' {services}")
        return v

    def with_difficulty(self, **knobs: Range) -> "Capability":
        """This capability with the given difficulty knobs set (the rest as they are)."""
        return self.model_copy(update={"difficulty": self.difficulty.model_copy(update=knobs)})

    def fingerprint(self) -> str:
        """Content hash: a changed capability file changes every artifact derived from it."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """Best-effort line number of a pydantic error location in the YAML source."""
    try:
        node = yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None
    for part in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if k.value == part), None)
            if nxt is None:
                return node.start_mark.line + 1
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
    return node.start_mark.line + 1 if node is not None else None


def _bad_scalar_line(text: str) -> int | None:
    """The line of the first scalar PyYAML cannot construct (an explicitly tagged bad value)."""
    try:
        root = yaml.compose(text)
    except (yaml.YAMLError, RecursionError):
        return None
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:  # aliases may make the node graph cyclic
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            try:
                yaml.constructor.SafeConstructor().construct_object(node)
            except Exception:  # noqa: BLE001 - this is the value that broke the document
                return node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
        elif isinstance(node, yaml.MappingNode):
            for k, v in reversed(node.value):
                stack.extend([v, k])
    return None


def parse_capability(text: str, source: str = "<string>") -> Capability:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise CapabilityError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:  # PyYAML composes recursively: ~500 nested '[' exhaust the stack
        raise CapabilityError(f"{source}:1: invalid YAML: nesting too deep") from None
    except Exception as e:  # noqa: BLE001 - PyYAML's constructors raise bare ValueError/IndexError/... ('!!int', '!!float .')
        line = _bad_scalar_line(text)
        raise CapabilityError(f"{source}:{line or '?'}: invalid YAML value: {type(e).__name__}: {e}") from None
    if not isinstance(data, dict):
        raise CapabilityError(f"{source}:1: a capability file must be a mapping, got {type(data).__name__}")
    try:
        return Capability.model_validate(data)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = tuple(err["loc"])
            line = _line_of(text, loc)
            field = ".".join(str(p) for p in loc) or "(root)"
            msgs.append(f"{source}:{line or '?'}: {field}: {err['msg']}")
        raise CapabilityError("\n".join(msgs)) from None


def with_knob(text: str, cap: Capability, knob: str, value: Range, why: str) -> tuple[Capability, str]:
    """``cap`` with ``difficulty.<knob>`` set to ``value``, and its YAML ``text`` saying so: the knob's value is
    replaced (or added to the ``difficulty`` block) where the file has it, with ``# <why>`` beside it, and every other
    line kept (so a table that stores the text still shows what drafted its environments). Where the file's layout
    defeats that edit (a flow-style ``difficulty``), the whole capability is written out instead, under the note."""
    want = cap.with_difficulty(**{knob: value})
    flow = f"{{min: {value.min}, max: {value.max}}}  # {why}"
    lines = text.splitlines()
    try:
        root = yaml.compose(text)
        diff = next((v for k, v in root.value if k.value == "difficulty"), None) if isinstance(root, yaml.MappingNode) else None
        if diff is None:
            lines += ["difficulty:", f"  {knob}: {flow}"]
        elif isinstance(diff, yaml.MappingNode) and not diff.flow_style and diff.value:
            node = next((v for k, v in diff.value if k.value == knob), None)
            indent = diff.value[0][0].start_mark.column
            if node is not None and node.start_mark.line == node.end_mark.line:
                lines[node.start_mark.line] = lines[node.start_mark.line][:node.start_mark.column] + flow
            elif node is None:
                last = max(v.end_mark.line - (1 if v.end_mark.column == 0 else 0) for _, v in diff.value)
                lines.insert(last + 1, " " * indent + f"{knob}: {flow}")
        edited = "\n".join(lines) + "\n"
        if parse_capability(edited) == want:
            return want, edited
    except (yaml.YAMLError, CapabilityError, IndexError):
        pass
    return want, f"# {why}\n" + yaml.safe_dump(want.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def load_capability(path: str | Path) -> Capability:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:  # a missing/unreadable file, or one that is not UTF-8 text
        raise CapabilityError(f"{p}: cannot read capability file: {e}") from None
    cap = parse_capability(text, str(p))
    if cap.id != p.stem:
        raise CapabilityError(f"{p}:1: id: capability id '{cap.id}' must match the file name '{p.stem}'")
    return cap


def load_catalog(folder: str | Path | None = None) -> dict[str, Capability]:
    folder = Path(folder) if folder else CATALOG_DIR
    if not folder.is_dir():
        raise CapabilityError(f"{folder}: capability catalog folder does not exist")
    caps: dict[str, Capability] = {}
    for path in sorted(folder.glob("*.yaml")):
        cap = load_capability(path)
        caps[cap.id] = cap
    if not caps:
        raise CapabilityError(f"{folder}: no capability files (*.yaml) found")
    return caps
