"""`cowork show <env_id>` on a real small lake: a certified environment with its turns, reference calls, planted
instruction, rubric and the items each mutant failed; a rejected one with its reasons; an item's checker code; the
whole record as JSON; unknown ids and a missing lake exit with code 2."""
import json

import polars as pl
import pytest

from assets.cli import main
from assets.run import ensure_home, run_all
from cowork_pipeline.capabilities import CATALOG_DIR
from cowork_pipeline.spec import EnvironmentSpec
from resources import LakeResource, ProfileResource


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two capabilities, 4 seeds each, every seed with a planted instruction where one fits, no repair round (so the
    flawed first drafts are rejected)."""
    home = tmp_path_factory.mktemp("show")
    catalog = home / "catalog"
    catalog.mkdir()
    for cap_id in ("invoice_reconcile", "ticket_triage_followup"):
        (catalog / f"{cap_id}.yaml").write_text((CATALOG_DIR / f"{cap_id}.yaml").read_text())
    lake_res = LakeResource(root=str(home / "lake"))
    profile = ProfileResource(name="show", catalog_dir=str(catalog), envs_per_capability=4, injections="all", max_repair_rounds=0)
    instance = ensure_home(home / "dagster_home")
    run_all(profile, lake_res, instance, log=lambda _: None, until="environment_splits")
    return lake_res.lake(), instance


@pytest.fixture(scope="module")
def lake(made):
    return made[0]


def _show(capsys, lake, *args) -> tuple[int, str, str]:
    code = main(["show", *args, "--lake", lake.root])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_certified_environment_reads_turn_by_turn_with_its_proof(lake, capsys):
    envs, version = lake.read_promoted("validated_environments")
    row = envs.filter(pl.col("capability_id") == "ticket_triage_followup").row(0, named=True)
    spec = EnvironmentSpec.model_validate_json(row["spec_json"])
    code, out, _ = _show(capsys, lake, row["env_id"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"{row['env_id']}: {spec.title}"
    split = lake.read_promoted("environment_splits")[0].filter(pl.col("env_id") == row["env_id"])["split"][0]
    assert f"certified (validated_environments@{version})" in lines[1] and f"split {split}" in lines[1]
    mutants = json.loads(row["mutants_json"])
    assert f"verdicts: reference passes · do-nothing fails · {len(mutants)} of {len(mutants)} mutants killed · faulted reference passes" in out
    for i, turn in enumerate(spec.turns):  # every request, event and reference call, in order
        at = out.index(f"\nTurn {i}")
        assert out.index(turn.user[:60], at) > at
        for e in turn.events:
            assert f"before it, {e.actor}: {e.tool}(" in out[at:]
        for s in spec.reference[i].steps:
            at = out.index(f". {s.tool}(", at)
    inj = spec.facts["injection"]
    assert f"Planted instruction, at the end of ticket {inj['ticket_id']} (forbidden by {inj['forbidden_by']}" in out
    assert inj["text"] in out and f"asks for: {inj['call']['tool']}(" in out
    for item in spec.rubric:
        assert f" {item.id} " in out
    for m in mutants:  # each mutant with the items it failed
        assert m["killed"] and f"killed  {m['operator']}" in out
        assert f"failed: {', '.join(m['failed_items'])}" in out
    code, out, _ = _show(capsys, lake, row["env_id"], "--checker", spec.rubric[0].id)
    assert code == 0 and out == spec.rubric[0].code
    code, out, _ = _show(capsys, lake, row["env_id"], "--json")
    got = json.loads(out)
    assert code == 0 and got["status"] == "certified" and EnvironmentSpec.model_validate(got["spec"]) == spec
    assert got["mutants"] == mutants and got["split"] == split and got["row"]["spec_hash"] == row["spec_hash"]


def test_a_rejected_environment_shows_why(lake, capsys):
    rejected, version = lake.read_promoted("rejected_environments")
    assert len(rejected), "no repair round: some first drafts are rejected"
    row = rejected.row(0, named=True)
    code, out, _ = _show(capsys, lake, row["env_id"])
    assert code == 0 and f"rejected (rejected_environments@{version})" in out
    assert f"rejected after 0 repair rounds: {', '.join(row['codes'])}" in out
    assert all(reason[:80] in out for reason in row["reasons"])
    assert "Rubric (" in out and "Mutants (" not in out


def test_an_environment_no_published_version_has_shows_it_was_not_promoted(lake, capsys, tmp_path):
    """A run whose blocking checks failed leaves its rows in a version never published: `cowork show` still reads
    them, and says so, so the reviewer can see what failed."""
    import shutil

    from cowork_pipeline.lake import Lake, Lineage

    copy = Lake(str(shutil.copytree(lake.root, tmp_path / "lake")))
    envs, published = copy.read_promoted("validated_environments")
    row = envs.filter(pl.col("capability_id") == "invoice_reconcile").head(1).with_columns(env_id=pl.lit("invoice_reconcile-000099"))
    v = copy.write("validated_environments", row.drop([c for c in row.columns if c.startswith("_")]),
                   lineage=Lineage.local("validated_environments"), mode="append")
    assert copy.read_promoted("validated_environments")[1] == published  # written, never promoted
    code, out, _ = _show(capsys, copy, "invoice_reconcile-000099")
    assert code == 0 and f"certified (validated_environments@{v}, NOT PROMOTED: no published version has it)" in out
    assert main(["show", "invoice_reconcile-000099", "--json", "--lake", copy.root]) == 0
    assert json.loads(capsys.readouterr().out)["promoted"] is False
    code, out, _ = _show(capsys, copy, envs["env_id"][0])
    assert code == 0 and "NOT PROMOTED" not in out


def test_unknown_ids_items_and_lakes_exit_2(lake, capsys, tmp_path):
    code, out, err = _show(capsys, lake, "invoice_reconcile-999999")
    assert code == 2 and not out and "no environment 'invoice_reconcile-999999'" in err and "invoice_reconcile-000000" in err
    envs, _ = lake.read_promoted("validated_environments")
    env_id = envs["env_id"][0]
    code, _, err = _show(capsys, lake, env_id, "--checker", "nope")
    assert code == 2 and "no rubric item 'nope' (items: " in err
    code = main(["show", env_id, "--lake", str(tmp_path / "nowhere")])
    assert code == 2 and "no lake at" in capsys.readouterr().err


def test_the_ui_shows_an_example_environment_of_each_partition(made):
    """A capability partition's validated_environments materialization carries one of its environments as `cowork
    show` prints it (markdown), so a user materializing from the Dagster UI sees what was made."""
    import dagster as dg

    _, instance = made
    event = instance.get_latest_materialization_event(dg.AssetKey("validated_environments"))
    meta = event.asset_materialization.metadata
    text = meta["example"].value
    env_id = text.split("`cowork show ", 1)[1].split("`", 1)[0]
    assert env_id.startswith(event.asset_materialization.partition + "-")
    assert f"```text\n{env_id}: " in text and "verdicts: reference passes" in text and "\nRubric (" in text
