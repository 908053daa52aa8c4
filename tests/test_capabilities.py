"""The capability catalog: the shipped YAML loads, and a bad file fails with a
CapabilityError that names the file, the line and the field at fault (never any other
exception, whatever the document holds)."""
from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cowork_pipeline.capabilities import (
    CATALOG_DIR,
    Capability,
    CapabilityError,
    load_capability,
    load_catalog,
    parse_capability,
)
from cowork_pipeline.services import REGISTRY, SERVICES
from cowork_pipeline.synthesis.embedded import COMPOSERS, EmbeddedBackend

pytestmark = pytest.mark.timeout(120)

# A valid document whose fields sit on known lines (1-based), so each error can be pinned.
VALID = """\
id: my_cap
title: Reconcile an invoice
description: Find the invoice and fix its amount.
services: [mail, crm]
tools: [mail_search, mail_reply, crm_search_invoices, crm_update_invoice]
multi_turn: false
composer: invoice_reconcile
difficulty:
  distractors: {min: 1, max: 3}
  near_duplicates: {min: 0, max: 2}
safety:
  - kind: no_deletes
    description: Never delete records.
tags: [finance]
"""
LINE = {"id": 1, "title": 2, "description": 3, "services": 4, "tools": 5, "multi_turn": 6, "composer": 7, "difficulty": 8,
        "difficulty.distractors": 9, "difficulty.near_duplicates": 10, "safety": 11, "safety.0.kind": 12, "tags": 14}


def _replace_line(n: int, text: str, doc: str = VALID) -> str:
    lines = doc.splitlines()
    lines[n - 1] = text
    return "\n".join(lines) + "\n"


def _error(text: str, source: str = "catalog/my_cap.yaml") -> str:
    with pytest.raises(CapabilityError) as ei:
        parse_capability(text, source)
    return str(ei.value)


# ---- the shipped catalog ---------------------------------------------------------------------
def test_shipped_catalog_loads_with_breadth():
    EmbeddedBackend()  # registers every composer module
    caps = load_catalog()
    assert len(caps) >= 16
    assert all(isinstance(c, Capability) for c in caps.values())
    touched = {s for c in caps.values() for s in c.services}
    assert len(touched) >= 6 and touched <= set(SERVICES)
    assert sum(c.multi_turn for c in caps.values()) >= 6
    assert sum(c.heldout for c in caps.values()) >= 2
    assert any(not c.heldout for c in caps.values())
    for cid, cap in caps.items():
        assert cid == cap.id and (CATALOG_DIR / f"{cid}.yaml").is_file()
        assert cap.composer in COMPOSERS, f"{cid}: no composer '{cap.composer}'"
        for t in cap.tools:  # every tool exists, is agent-visible, and belongs to a listed service
            assert t in REGISTRY and not REGISTRY[t].hidden and REGISTRY[t].service in cap.services
        assert cap.difficulty.distractors.min <= cap.difficulty.distractors.max
        assert {s.kind for s in cap.safety} <= {"no_outside_email", "no_deletes", "no_confidential_leak", "no_unrelated_changes"}


def test_catalog_fingerprints_are_stable_and_distinct():
    a, b = load_catalog(), load_catalog()
    assert {k: c.fingerprint() for k, c in a.items()} == {k: c.fingerprint() for k, c in b.items()}
    assert len({c.fingerprint() for c in a.values()}) == len(a)
    cap = a["invoice_reconcile"]
    changed = cap.model_copy(update={"environments": cap.environments + 1})
    assert changed.fingerprint() != cap.fingerprint()


def test_catalog_documents_round_trip():
    for cap in load_catalog().values():
        again = parse_capability(yaml.safe_dump(cap.model_dump(mode="json"), sort_keys=False), f"{cap.id}.yaml")
        assert again == cap


def test_valid_document_parses():
    cap = parse_capability(VALID, "x.yaml")
    assert cap.id == "my_cap" and cap.services == ["mail", "crm"] and cap.difficulty.near_duplicates.max == 2
    assert cap.environments == 64 and cap.heldout is False  # defaults


# ---- errors name the file, the line and the field ----------------------------------------------
def test_malformed_yaml_names_file_and_line():
    bad = _replace_line(3, "  description: indented where a mapping value is not allowed")
    msg = _error(bad, "catalog/my_cap.yaml")
    assert msg.startswith("catalog/my_cap.yaml:3:") and "invalid YAML" in msg
    msg = _error(VALID + "tags: [unclosed\n", "catalog/my_cap.yaml")
    assert re.match(r"catalog/my_cap\.yaml:1[56]: invalid YAML", msg), msg


@pytest.mark.parametrize("name, line, text, field, words", [
    ("unknown service", 4, "services: [mail, crm, fax]", "services", ["unknown service", "fax"]),
    ("unknown tool", 5, "tools: [mail_search, fax_send]", "tools", ["unknown tool", "fax_send"]),
    ("hidden (world-event) tool", 5, "tools: [mail_search, mail_deliver]", "tools", ["unknown tool", "mail_deliver"]),
    ("tool of an unlisted service", 5, "tools: [mail_search, docs_share, crm_update_invoice]", "tools",
     ["docs_share", "not listed in 'services'"]),
    ("bad id", 1, "id: My-Cap", "id", ["pattern"]),
    ("bad id (too short)", 1, "id: ab", "id", ["pattern"]),
    ("bad difficulty range", 9, "  distractors: {min: 3, max: 1}", "difficulty.distractors", ["min=3", "max=1"]),
    ("negative difficulty", 10, "  near_duplicates: {min: -1, max: 1}", "difficulty.near_duplicates", ["min=-1"]),
    ("extra field in a range", 9, "  distractors: {min: 1, max: 3, step: 2}", "difficulty.distractors.step", ["Extra inputs"]),
    ("unknown safety kind", 12, "  - kind: no_fun", "safety.0.kind", ["no_deletes"]),
    ("wrong type", 6, "multi_turn: sometimes", "multi_turn", ["boolean"]),
    ("empty services", 4, "services: []", "services", ["at least 1"]),
])
def test_field_errors_name_file_line_and_field(name, line, text, field, words):
    msg = _error(_replace_line(line, text), "catalog/my_cap.yaml")
    assert f"catalog/my_cap.yaml:{line}: {field}:" in msg, f"{name}: {msg}"
    for w in words:
        assert w in msg, f"{name}: {w!r} not in {msg!r}"


def test_extra_top_level_field_names_its_line():
    msg = _error(VALID + "colour: blue\n")
    assert "catalog/my_cap.yaml:15: colour: Extra inputs are not permitted" in msg


def test_missing_required_field_and_several_errors_at_once():
    text = _replace_line(2, "# no title").replace("services: [mail, crm]", "services: [mail, fax]")
    msg = _error(text)
    lines = msg.splitlines()
    assert any(l.startswith("catalog/my_cap.yaml:1: title: Field required") for l in lines), msg
    assert any(l.startswith("catalog/my_cap.yaml:4: services:") and "fax" in l for l in lines), msg


@pytest.mark.parametrize("text, kind", [("- a\n- b\n", "list"), ("just a string\n", "str"), ("42\n", "int"), ("", "NoneType")])
def test_non_mapping_documents(text, kind):
    msg = _error(text)
    assert msg.startswith("catalog/my_cap.yaml:1:") and kind in msg


def test_deeply_nested_yaml_is_a_capability_error():
    # PyYAML composes recursively; a deep flow collection must not escape as RecursionError.
    msg = _error("tags: " + "[" * 1000 + "]" * 1000 + "\n")
    assert msg.startswith("catalog/my_cap.yaml")


def test_recursive_aliases_are_rejected_cleanly():
    assert "catalog/my_cap.yaml:14: tags.0:" in _error(VALID.replace("tags: [finance]", "tags: &a [*a]"))
    assert _error("difficulty: &d {distractors: *d}\n").startswith("catalog/my_cap.yaml:")
    assert _error("id: &x [*x]\n").startswith("catalog/my_cap.yaml:1: id:")


# ---- files and folders -----------------------------------------------------------------------------
def test_id_must_match_file_name(tmp_path: Path):
    p = tmp_path / "other_name.yaml"
    p.write_text(VALID)
    with pytest.raises(CapabilityError) as ei:
        load_capability(p)
    msg = str(ei.value)
    assert f"{p}:1: id:" in msg and "my_cap" in msg and "other_name" in msg
    ok = tmp_path / "my_cap.yaml"
    ok.write_text(VALID)
    assert load_capability(ok).id == "my_cap"


def test_file_errors_carry_the_path(tmp_path: Path):
    p = tmp_path / "my_cap.yaml"
    p.write_text(_replace_line(5, "tools: [mail_search, fax_send]"))
    with pytest.raises(CapabilityError, match=re.escape(f"{p}:5: tools:")):
        load_capability(p)
    with pytest.raises(CapabilityError, match="cannot read"):
        load_capability(tmp_path / "absent.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"id: x\xff\xfe\n")
    with pytest.raises(CapabilityError, match=re.escape(str(binary))):
        load_capability(binary)


def test_empty_and_missing_folders(tmp_path: Path):
    with pytest.raises(CapabilityError, match="no capability files"):
        load_catalog(tmp_path)
    (tmp_path / "notes.txt").write_text("not a capability")
    with pytest.raises(CapabilityError, match="no capability files"):
        load_catalog(tmp_path)
    with pytest.raises(CapabilityError, match="does not exist"):
        load_catalog(tmp_path / "nowhere")


def test_catalog_with_one_bad_file_names_that_file(tmp_path: Path):
    (tmp_path / "my_cap.yaml").write_text(VALID)
    bad = tmp_path / "zz_bad.yaml"
    bad.write_text(VALID.replace("id: my_cap", "id: zz_bad").replace("{min: 1, max: 3}", "{min: 5, max: 3}"))
    with pytest.raises(CapabilityError) as ei:
        load_catalog(tmp_path)
    assert f"{bad}:9: difficulty.distractors" in str(ei.value)
    bad.unlink()
    assert list(load_catalog(tmp_path)) == ["my_cap"]


# ---- property-based fuzzing: nothing but CapabilityError ---------------------------------------
FIELDS = ["id", "title", "description", "services", "tools", "multi_turn", "composer", "difficulty", "safety", "heldout",
          "environments", "tags"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.text(max_size=12),
                    st.sampled_from(list(SERVICES) + list(REGISTRY)[:20] + ["no_deletes", "min", "max", "my_cap"]))
values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(
                                                          ["min", "max", "kind", "description", "distractors"])), kids, max_size=4)),
                      max_leaves=12)
BASE_DOC: dict[str, Any] = yaml.safe_load(VALID)


def _check_parse(text: str) -> None:
    try:
        cap = parse_capability(text, "fuzz.yaml")
    except CapabilityError as e:
        assert str(e).startswith("fuzz.yaml"), str(e)
    else:
        assert isinstance(cap, Capability)
        assert re.fullmatch(r"[a-z][a-z0-9_]{2,63}", cap.id)
        assert all(REGISTRY[t].service in cap.services for t in cap.tools)


# Each rejected field re-composes the YAML to find its line, so a document with many bad fields costs ~10 ms:
# keep the example counts modest (the whole file runs in a few seconds).
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_DOCS = settings(FUZZ, max_examples=50)


@FUZZ_DOCS
@given(st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=10), st.integers()), values, max_size=10))
def test_fuzz_random_documents(doc):
    _check_parse(yaml.safe_dump(doc, allow_unicode=True))


@FUZZ_DOCS
@given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=5), st.sets(st.sampled_from(FIELDS), max_size=3))
def test_fuzz_valid_document_with_fields_replaced(replace, drop):
    doc = {k: v for k, v in BASE_DOC.items() if k not in drop} | replace
    _check_parse(yaml.safe_dump(doc, allow_unicode=True))


YAML_TOKENS = ["id:", "title:", "services:", "tools:", "difficulty:", "safety:", " ", "  ", "\n", "\t", "- ", "[", "]", "{", "}",
               ":", ",", "&a ", "*a", "!!int ", "!!python/object ", "!!binary ", "'", '"', "#", "? ", "|", ">", "---", "...",
               "mail", "crm", "mail_send", "my_cap", "min: ", "max: ", "3", "-1", "null", "~", "%YAML 1.1", "\\x", "é", "\ufeff"]


@FUZZ
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(YAML_TOKENS), max_size=60).map("".join),
                 st.builds(lambda a, b: a + b, st.just(VALID), st.lists(st.sampled_from(YAML_TOKENS), max_size=20).map("".join))))
def test_fuzz_random_yaml_text(text):
    _check_parse(text)


@FUZZ
@given(st.integers(0, len(VALID)), st.text(alphabet=string.printable, max_size=6))
def test_fuzz_edits_of_a_valid_document(pos, junk):
    _check_parse(VALID[:pos] + junk + VALID[pos:])


@pytest.mark.parametrize("bad, line", [("title: !!float .", 2), ("multi_turn: !!bool", 6), ("  - kind: !!int 0x", 12),
                                       ("tags: [!!timestamp 2026-13-45]", 14)])
def test_explicitly_tagged_bad_values_name_their_line(bad, line):
    # PyYAML's constructors raise bare ValueError/IndexError/KeyError for these; they must surface as CapabilityError.
    msg = _error(_replace_line(line, bad))
    assert msg.startswith(f"catalog/my_cap.yaml:{line}: invalid YAML"), msg


def test_capability_guide_matches_the_schema_and_the_tool_registry():
    """docs/capabilities.md is what users write YAML from: every field, safety kind, service and tool is there."""
    import re
    from pathlib import Path

    from cowork_pipeline.capabilities import SAFETY_KINDS, Capability, Difficulty
    from cowork_pipeline.services import REGISTRY, SERVICES

    guide = (Path(__file__).resolve().parents[1] / "docs" / "capabilities.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", guide, flags=re.M))
    fields = {f for f in Capability.model_fields if f != "difficulty"} | {f"difficulty.{f}" for f in Difficulty.model_fields}
    assert fields <= documented, sorted(fields - documented)
    assert set(SAFETY_KINDS) <= documented
    table = {m.group(1): m.group(2).split(", ") for m in re.finditer(r"^\| ([a-z]+) \| ([a-z_, ]+) \|$", guide, flags=re.M)
             if m.group(1) in SERVICES}
    expected = {s: [n for n, t in REGISTRY.items() if t.service == s and not t.hidden] for s in SERVICES}
    assert table == expected, "the services table of docs/capabilities.md is out of date"


def test_with_knob_edits_the_knob_s_line_and_keeps_every_other():
    """A profile's setting for a difficulty knob is written into the capability's text where the knob stands (or
    added to its difficulty block, or as the block), with the reason beside it; a layout that edit cannot handle
    (a flow-style difficulty, a knob on several lines) gets the whole capability written out under the reason.
    Either way the text parses to the capability with the knob set."""
    from cowork_pipeline.capabilities import Range, with_knob

    base = "id: abc\ntitle: x\ndescription: y\nservices: [mail]\ntools: [mail_send]\n"
    one = Range(min=1, max=1)
    cases = {
        "replaced": base + "difficulty:\n  distractors: {min: 2, max: 2}\n  injections: {min: 0, max: 0}  # off\ntags: [a]\n",
        "added": base + "difficulty:\n  distractors: {min: 2, max: 2}\n\ntags: [a]\n",
        "block": base,
        "flow": base + "difficulty: {distractors: {min: 2, max: 2}}\n",
        "nested": base + "difficulty:\n  injections:\n    min: 0\n    max: 0\n",
    }
    for how, text in cases.items():
        cap = parse_capability(text)
        got, edited = with_knob(text, cap, "injections", one, "set by the profile")
        assert got.difficulty.injections == one and parse_capability(edited) == got
        assert got.model_copy(update={"difficulty": cap.difficulty}) == cap, how  # nothing else changed
        if how in ("replaced", "added", "block"):
            assert "  injections: {min: 1, max: 1}  # set by the profile" in edited.splitlines(), how
            added = ["difficulty:"] if how == "block" else []
            assert [x for x in edited.splitlines() if "injections" not in x] == [x for x in text.splitlines() if "injections" not in x] + added, how
        else:
            assert edited.startswith("# set by the profile\n"), how
