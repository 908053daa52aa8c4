"""Reliability and security, proved end to end on real processes, real Delta tables and real Dagster runs.

What this module adds on top of the unit-level suites (test_sandbox, test_lake, test_capabilities, ...):

1. Sandbox escapes end to end: hostile rubric checkers go through ``Validator.certify`` (and through the
   synthesis asset) and come out as ``checker_*`` diagnostics; the environment is rejected, nothing is
   written outside temp, secrets never reach a diagnostic, and the same validator certifies a good one.
2. Crash safety: a child process is SIGKILLed while its Delta write is in flight (data files already
   appearing), both for plain Lake writes and for a real ``dagster.materialize`` of a synthesis partition;
   every table stays at its last committed version and a re-run writes exactly the expected rows once.
3. Concurrency at the asset level: two processes materialize two partitions into one lake at once.
4. Bad input: corrupt / missing tables read by an asset, non-model checkpoints, invalid environment
   documents, unknown tools / services, a broken capability file at the asset level.
5. Property-based: mutated and truncated environment documents never make the validator raise.
6. Determinism and the contamination gate (re-materializing ``demonstrations`` alone cannot leak).
7. The figures: ``test_zz_reliability_figures`` prints them (see docs/reliability.md).
"""
from __future__ import annotations

import copy
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import dagster as dg
import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from assets.definitions import ALL_ASSETS, resources
from assets.run import ensure_home
from assets.synthesis import SYNTH_TABLES
from cowork_pipeline.capabilities import CATALOG_DIR, load_catalog
from cowork_pipeline.demonstrations import collect_teacher_trajectories, contamination_audit, curate
from cowork_pipeline.lake import LINEAGE_COLUMNS, Lake, LakeError, Lineage, TableNotFound
from cowork_pipeline.spec import EnvironmentSpec
from cowork_pipeline.synthesis.draft import Draft
from cowork_pipeline.synthesis.embedded import EmbeddedBackend
from cowork_pipeline.synthesis.llm import parse_spec
from cowork_pipeline.synthesis.tables import SynthesisTables, run_synthesis
from cowork_pipeline.training.student import CheckpointError
from cowork_pipeline.validation.certify import Certification, Validator
from cowork_pipeline.validation.sandbox import Sandbox, SandboxLimits
from resources import SMOKE_PROFILE, GeneratorResource, LakeResource, ProfileResource

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
CATALOG = load_catalog()
SEED_CAP = "ticket_triage_followup"  # its seed-0 draft certifies on the first pass: the "good" environment
SECRET_VAR = "COWORK_RELIABILITY_SECRET"
SECRET = "s3cr3t-7f1c9a"
# One id column per synthesis table: "exactly once" means each expected id appears once in the partition.
SYNTH_IDS = {"environment_drafts": "attempt_id", "repair_log": "attempt_id", "validated_environments": "env_id",
             "rejected_environments": "env_id", "repair_telemetry": "capability_id"}
# Partitions: A is crashed twice, B and C are written concurrently (C is a held-out capability).
CAP_A, CAP_B, CAP_C = "ticket_triage_followup", "invoice_reconcile", "weekly_task_digest"
CAP_HOSTILE = "contact_update_from_signature"
PROMOTIONS = "_promotions"

# Figures recorded while the tests run; printed by the last test.
FIGURES: dict[str, Any] = {"probes": {}, "kill9": {}, "concurrency": {}, "bad_input": set(), "hypothesis": {}}


def _count(section: str, key: str, n: int = 1) -> None:
    FIGURES[section][key] = FIGURES[section].get(key, 0) + n


# ==================================================================================================
# Shared fixtures and helpers
# ==================================================================================================
@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(workers=1) as box:
        yield box


@pytest.fixture(scope="module")
def good_draft(sandbox) -> Draft:
    draft = EmbeddedBackend().draft(CATALOG[SEED_CAP], 0)
    assert Validator(sandbox).certify(draft).certified, "the reference environment must certify"
    return draft


def with_checker(draft: Draft, code: str, seed: int | None = None, item: int = 0) -> Draft:
    """The draft with rubric item ``item``'s checker replaced by ``code`` (and, optionally, another env id)."""
    spec = draft.spec
    rubric = [r.model_copy(update={"code": code}) if i == item else r for i, r in enumerate(spec.rubric)]
    update: dict[str, Any] = {"rubric": rubric}
    if seed is not None:
        update.update(seed=seed, env_id=f"{spec.capability_id}-{seed:06d}")
    return replace(draft, spec=spec.model_copy(update=update), seed=draft.seed if seed is None else seed)


def codes(cert: Certification) -> set[str]:
    return {d.code for d in cert.diagnostics}


def tree_state(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``path`` with its size and mtime (to prove nothing was written)."""
    out = {}
    for base, _, names in os.walk(path):
        for n in names:
            st_ = os.stat(os.path.join(base, n))
            out[os.path.relpath(os.path.join(base, n), path)] = (st_.st_size, st_.st_mtime_ns)
    return out


@dataclass
class House:
    """A persistent Dagster instance plus a lake, as ``cowork run`` uses them."""

    home: Path
    dagster_home: Path
    lake_root: str
    instance: dg.DagsterInstance

    @property
    def lake(self) -> Lake:
        return Lake(self.lake_root)


def materialize(h: House, keys: list[str], partition: str | None = None, *, lake_root: str | None = None,
                profile: dict[str, Any] | None = None, generator: Any = None) -> dg.ExecuteInProcessResult:
    res = resources(ProfileResource(**(profile or SMOKE_PROFILE)), LakeResource(root=lake_root or h.lake_root))
    if generator is not None:
        res["generator"] = generator
    return dg.materialize(ALL_ASSETS, selection=[dg.AssetKey(k) for k in keys], partition_key=partition,
                          instance=h.instance, resources=res, raise_on_error=False)


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    return "\n".join(ev.step_failure_data.error.to_string() for ev in result.all_events if ev.is_step_failure)


@pytest.fixture(scope="module")
def house(tmp_path_factory):
    home = tmp_path_factory.mktemp("reliability")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home / "dagster_home"))  # ensure_home sets it; restored after the module
        instance = ensure_home(home / "dagster_home")
        h = House(home, home / "dagster_home", str(home / "lake"), instance)
        res = materialize(h, ["capability_specs"])
        assert res.success, failure_text(res)
        yield h
        instance.dispose()


@pytest.fixture(scope="module")
def expected(sandbox) -> Callable[[str], SynthesisTables]:
    """What a smoke-profile partition must contain, computed in this process (determinism makes it exact)."""
    cache: dict[str, SynthesisTables] = {}
    p = ProfileResource(**SMOKE_PROFILE)

    def get(cid: str) -> SynthesisTables:
        if cid not in cache:
            cache[cid] = run_synthesis(CATALOG[cid], range(p.envs_per_capability), EmbeddedBackend(),
                                       Validator(sandbox, fault_rate=p.validation_fault_rate), max_rounds=p.max_repair_rounds)
        return cache[cid]

    return get


def expected_ids(tables: SynthesisTables, table: str) -> list[str]:
    frame = {"environment_drafts": tables.drafts, "repair_log": tables.repair_log, "validated_environments": tables.validated,
             "rejected_environments": tables.rejected}.get(table)
    if frame is None:  # repair_telemetry: one row per partition
        return [tables.telemetry["capability_id"]]
    return sorted(frame[SYNTH_IDS[table]].to_list())


VERDICT_COLUMNS = ["env_id", "spec_json", "spec_hash", "reference_pass", "null_pass", "fault_pass", "equivalent_pass", "deterministic", "mutants",
                   "kill_rate", "confusion_json", "mutants_json", "difficulty", "rounds", "final_attempt_id"]


def assert_partition_exact(lake: Lake, cid: str, want: SynthesisTables, *, promoted: bool = True) -> dict[str, str]:
    """Each synthesis table holds exactly the expected rows of partition ``cid``, once, all from one run.
    Returns table -> the run id that wrote the partition."""
    writers = {}
    for table, id_col in SYNTH_IDS.items():
        df = lake.read_promoted(table)[0] if promoted else lake.read(table)
        rows = df.filter(pl.col("capability_id") == cid)
        assert sorted(rows[id_col].to_list()) == expected_ids(want, table), (table, cid)
        assert rows["_run_id"].n_unique() <= 1, f"{table}[{cid}] mixes rows of several runs"
        if len(rows):
            writers[table] = rows["_run_id"][0]
        if table == "validated_environments":  # byte-identical environments and verdicts
            got = rows.select(VERDICT_COLUMNS).sort("env_id")
            exp = want.validated.select(VERDICT_COLUMNS).sort("env_id")
            assert got.equals(exp), (cid, _differences(got, exp))
    return writers


def _differences(got: pl.DataFrame, want: pl.DataFrame) -> dict[str, Any]:
    """Which columns of two frames of one shape differ, with the first differing pair of each (a failure says
    what changed, not only that something did)."""
    if got.shape != want.shape:
        return {"shape": (got.shape, want.shape)}
    out = {}
    for col in got.columns:
        for a, b in zip(got[col].to_list(), want[col].to_list()):
            if a != b:
                out[col] = (str(a)[:300], str(b)[:300])
                break
    return out


def ensure_partitions(h: House, cids: list[str]) -> None:
    """Materialize (in process) the partitions an earlier test would have left, so each test also runs alone."""
    lake = h.lake
    present: set[str] = set()
    if lake.exists("repair_telemetry"):
        try:
            present = set(lake.read_promoted("repair_telemetry")[0]["capability_id"].to_list())
        except LakeError:
            present = set()
    for cid in cids:
        if cid not in present:
            res = materialize(h, list(SYNTH_TABLES), cid)
            assert res.success, failure_text(res)


# ---- child processes ------------------------------------------------------------------------------
CHILD_MATERIALIZE = r"""
import os, sys, time
home, lake_root, partition, go = sys.argv[1:5]
import dagster as dg
from assets.definitions import ALL_ASSETS, resources
from assets.run import ensure_home
from assets.synthesis import SYNTH_TABLES
from resources import SMOKE_PROFILE, LakeResource, ProfileResource
instance = ensure_home(home)
res = resources(ProfileResource(**SMOKE_PROFILE), LakeResource(root=lake_root))
print("READY", flush=True)
while go != "-" and not os.path.exists(go):
    time.sleep(0.01)
result = dg.materialize(ALL_ASSETS, selection=[dg.AssetKey(t) for t in SYNTH_TABLES], partition_key=partition,
                        instance=instance, resources=res, raise_on_error=False)
checks = [e.passed for e in result.get_asset_check_evaluations()]
print("RESULT", result.success, all(checks), result.run_id, flush=True)
sys.exit(0 if result.success else 1)
"""

FRAME_SRC = r"""
import polars as pl

def big_frame(n, tag, cap="A"):
    i = pl.int_range(n)
    # hashes compress badly, so the writer produces many data files over a few seconds
    return pl.select(id=pl.format("{}-{}", pl.lit(cap), i.cast(pl.String).str.zfill(8)), cap=pl.lit(cap), tag=pl.lit(tag),
                     h1=i.hash(seed=1).cast(pl.String), h2=i.hash(seed=2).cast(pl.String), n=i)
"""

CHILD_WRITE = FRAME_SRC + r"""
import sys
from cowork_pipeline.lake import Lake, Lineage
root, table, how, n, tag = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
lake = Lake(root)
df = big_frame(n, tag)
print("WRITING", flush=True)
if how == "partition":
    lake.write(table, df, lineage=Lineage.local("crash"), mode="overwrite", replace_where="cap = 'A'")
else:
    lake.write(table, df, lineage=Lineage.local("crash"), key=["id"])
print("COMMITTED", flush=True)
"""
_ns: dict[str, Any] = {}
exec(FRAME_SRC, _ns)
big_frame: Callable[..., pl.DataFrame] = _ns["big_frame"]


def spawn(code: str, args: list[Any], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        # Own session: after the kill, its helpers (sandbox worker, log watchers) are reaped by group id.
        return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def files_under(dirs: list[str]) -> set[str]:
    out: set[str] = set()
    for d in dirs:
        for base, _, names in os.walk(d):
            out.update(os.path.join(base, n) for n in names)
    return out


def kill9_when_data_appears(proc: subprocess.Popen, dirs: list[str], log: Path, timeout_s: float = 240) -> set[str]:
    """SIGKILL ``proc`` as soon as a new file appears under ``dirs`` (its Delta write has started)."""
    before = files_under(dirs)
    deadline = time.monotonic() + timeout_s
    new: set[str] = set()
    while time.monotonic() < deadline and proc.poll() is None:
        new = files_under(dirs) - before
        if new:
            break
        time.sleep(0.002)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    reap(proc)
    out = log.read_text(errors="replace")
    assert proc.returncode == -signal.SIGKILL, f"child ended on its own (rc {proc.returncode}) before any write:\n{out[-3000:]}"
    assert new, f"no data file appeared before the timeout:\n{out[-3000:]}"
    return new


# ==================================================================================================
# 1. Sandbox escape probes, end to end through Validator.certify
# ==================================================================================================
WALK = ("def check(ev):\n    for c in ().__class__.__bases__[0].__subclasses__():\n        if c.__name__ == '_wrap_close':\n"
        "            g = c.__init__.__globals__\n            {body}\n    return True\n")


def static_probes(lake_root: Path, canary: Path, decoy_pid: int) -> dict[str, tuple[str, set[str]]]:
    """Probes aimed at the pipeline itself (its lake, its process, its secrets, the verdict), as the
    pipeline's default sandbox (static policy on) sees them: name -> (checker source, allowed diagnostic codes)."""
    log = lake_root / "validated_environments" / "_delta_log" / "00000000000000000001.json"
    secret_file = lake_root / "validated_environments" / "secret.txt"
    return {
        "forge_delta_commit": (f"def check(ev):\n    open({str(log)!r}, 'w').write('{{}}')\n    return True\n", {"checker_forbidden"}),
        "delete_the_lake": (f"import shutil\ndef check(ev):\n    shutil.rmtree({str(lake_root)!r})\n    return True\n",
                            {"checker_forbidden"}),
        "exfiltrate_lake_file_via_diagnostic": (f"def check(ev):\n    raise ValueError(open({str(secret_file)!r}).read())\n",
                                                {"checker_forbidden"}),
        "exfiltrate_env_via_diagnostic": (f"import os\ndef check(ev):\n    raise ValueError(os.environ.get({SECRET_VAR!r}))\n",
                                          {"checker_forbidden"}),
        "kill_the_pipeline": (f"import os, signal\ndef check(ev):\n    os.kill({decoy_pid}, signal.SIGKILL)\n    return True\n",
                              {"checker_forbidden"}),
        "pickle_rce": (f"import pickle\ndef check(ev):\n    return pickle.loads(b\"cos\\nsystem\\n(S'touch {canary}'\\ntR.\") == 0\n",
                       {"checker_forbidden"}),
        "write_canary_via_dunder_import": (f"def check(ev):\n    __import__('os').system('touch {canary}')\n    return True\n",
                                           {"checker_forbidden"}),
        "exit_the_worker": ("def check(ev):\n    raise SystemExit(0)\n", {"checker_error"}),
        "interrupt_the_worker": ("def check(ev):\n    raise KeyboardInterrupt\n", {"checker_error"}),
        "truthy_non_bool_verdict": ("def check(ev):\n    return 1\n", {"checker_error"}),
        "oversized_verdict": ("def check(ev):\n    return 'x' * 10**6\n", {"checker_error"}),
        "poison_stdlib_for_the_next_env": ("import json\ndef check(ev):\n    json.loads = lambda *a, **k: True\n    return True\n",
                                           {"checker_error"}),
        "syntax_error": ("def check(ev):\n    return (\n", {"checker_compile_error"}),
    }


def runtime_probes(lake_root: Path, canary: Path, decoy_pid: int) -> dict[str, tuple[str, set[str]]]:
    """The same attacks with the static policy off: only the runtime layers (audit hook, seccomp, rlimits,
    scrubbed environment) stand between the checker and the pipeline."""
    log = lake_root / "validated_environments" / "_delta_log" / "00000000000000000001.json"
    data = next(iter(sorted(glob.glob(str(lake_root / "validated_environments" / "*.parquet")))))
    nl = "\n            "
    return {
        "forge_delta_commit": (WALK.format(body=f"fd = g['open']({str(log)!r}, 0o101){nl}g['write'](fd, b'{{}}')"), {"checker_forbidden"}),
        "delete_a_data_file": (WALK.format(body=f"g['unlink']({data!r})"), {"checker_forbidden"}),
        "exfiltrate_env_via_diagnostic": (WALK.format(body="raise ValueError(repr(dict(g['environ'])))"),
                                          {"checker_forbidden", "checker_error"}),
        "kill_the_pipeline": (WALK.format(body=f"g['kill']({decoy_pid}, 9)"), {"checker_forbidden"}),
        "write_canary": (WALK.format(body=f"g['system']('touch {canary}')"), {"checker_forbidden"}),
        "import_os": ("import os\ndef check(ev):\n    return os.getcwd() != ''\n", {"checker_forbidden"}),
        "exit_the_worker": ("def check(ev):\n    raise SystemExit(0)\n", {"checker_error"}),
    }


@pytest.mark.parametrize("layer", ["static_policy", "runtime_only"])
def test_escape_probes_in_rubric_checkers_are_rejected_end_to_end(layer, good_draft, tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_VAR, SECRET)  # before the sandbox starts: a leak would have something to leak
    lake = Lake(tmp_path / "lake")
    lake.write("validated_environments", pl.DataFrame({"env_id": ["e1"], "spec_json": ["{}"]}), lineage=Lineage.local("t"),
               key=["env_id"])
    (tmp_path / "lake" / "validated_environments" / "secret.txt").write_text(SECRET)
    canary = tmp_path / "pwned"
    decoy = subprocess.Popen(["sleep", "120"])  # stands in for the pipeline process a probe tries to kill
    try:
        make = static_probes if layer == "static_policy" else runtime_probes
        probes = make(tmp_path / "lake", canary, decoy.pid)
        lake_before, cwd, env_before = tree_state(tmp_path / "lake"), os.getcwd(), dict(os.environ)
        with Sandbox(workers=1, limits=SandboxLimits(call_timeout_s=0.5), static_policy=(layer == "static_policy")) as box:
            validator = Validator(box)
            names = sorted(probes)
            drafts = [good_draft] + [with_checker(good_draft, probes[n][0], seed=100 + i) for i, n in enumerate(names)] + [good_draft]
            certs = validator.certify_many(drafts)  # one sandbox batch: probes and good environments side by side
            assert certs[0].certified and certs[-1].certified, "a probe in the same batch harmed a good environment"
            item = good_draft.spec.rubric[0].id
            for name, cert in zip(names, certs[1:-1]):
                allowed = probes[name][1]
                checker = {d.code for d in cert.diagnostics if d.code.startswith("checker_")}
                assert not cert.certified, name
                assert checker and checker <= allowed, (name, [(d.code, d.message) for d in cert.diagnostics])
                assert all(d.item == item for d in cert.diagnostics if d.code.startswith("checker_")), name
                assert all(SECRET not in d.message and SECRET not in json.dumps(d.detail) for d in cert.diagnostics), name
                _count("probes", f"validator/{layer}")
            # the same validator, after all that, still certifies a good environment
            assert validator.certify(good_draft).certified
        assert not canary.exists() and not glob.glob(f"{canary}*")
        assert tree_state(tmp_path / "lake") == lake_before, "a probe changed the lake"
        assert lake.read("validated_environments")["env_id"].to_list() == ["e1"]
        assert decoy.poll() is None, "a probe killed another process"
        assert os.getcwd() == cwd and dict(os.environ) == env_before
    finally:
        decoy.kill()
        decoy.wait()


# ==================================================================================================
# 2. Crash safety: kill -9 while a Delta write is in flight
# ==================================================================================================
N_ROWS = 300_000


def _data(df: pl.DataFrame) -> pl.DataFrame:
    return df.drop([c for c in LINEAGE_COLUMNS if c in df.columns]).sort("id")


@pytest.mark.parametrize("how", ["create", "merge", "partition"])
def test_kill9_mid_delta_write_keeps_last_committed_version(how, tmp_path):
    """A child writing a large frame is SIGKILLed once its data files appear: the table stays at its last
    committed version (or absent, for a first write), with exactly the previous rows; re-running the write
    gives the expected rows once, and re-running it again changes nothing (writes keyed by ids)."""
    root = str(tmp_path / "lake")
    lake = Lake(root)
    base = None
    if how != "create":
        base = pl.DataFrame({"id": ["A-00000001", "A-00000002", "A-old", "B-1", "B-2"], "cap": ["A", "A", "A", "B", "B"],
                             "tag": ["old"] * 5, "h1": ["x"] * 5, "h2": ["y"] * 5, "n": [1, 2, -1, 10, 20]})
        lake.write("t", base, lineage=Lineage.local("base"), key=["id"])
        from deltalake import DeltaTable

        # Small data files: a large write then streams many files, so the kill lands mid-write.
        DeltaTable(lake.uri("t")).alter.set_table_properties({"delta.targetFileSize": "262144"})
    v_before = lake.version("t")
    log = tmp_path / "child.log"
    proc = spawn(CHILD_WRITE, [root, "t", how, N_ROWS, "new"], log)
    new_files = kill9_when_data_appears(proc, [lake.uri("t")], log)
    assert "COMMITTED" not in log.read_text(), "the write finished before the kill; make the frame larger"

    # After the crash: the last committed version, the previous rows, nothing partial visible.
    if how == "create":
        assert not lake.exists("t") and lake.version("t") is None
        with pytest.raises(TableNotFound):
            lake.read("t")
    else:
        assert lake.version("t") == v_before
        assert _data(lake.read("t")).equals(_data(base)), "rows of the killed write are visible"
        assert lake.history("t", limit=1)[0]["version"] == v_before
    assert new_files  # the killed writer left orphaned data files on disk; no commit references them

    # Re-running completes with exactly the expected rows, once; running it again is a no-op on the data.
    new = big_frame(N_ROWS, "new")
    if how == "partition":
        want = pl.concat([new, base.filter(pl.col("cap") == "B")])
        write = lambda: lake.write("t", new, lineage=Lineage.local("rerun"), mode="overwrite", replace_where="cap = 'A'")  # noqa: E731
    else:
        want = new if base is None else pl.concat([new, base.filter(~pl.col("id").is_in(new["id"].to_list()))])
        write = lambda: lake.write("t", new, lineage=Lineage.local("rerun"), key=["id"])  # noqa: E731
    for attempt in range(2):
        write()
        out = lake.read("t")
        assert out.height == want.height and out["id"].n_unique() == want.height, attempt
        assert _data(out).equals(_data(want)), attempt
    _count("kill9", f"lake/{how}")


def test_kill9_during_first_materialization_of_a_partition(house, expected, tmp_path):
    """A real `dagster.materialize` of a synthesis partition, SIGKILLed once its first Delta data file appears."""
    _kill9_materialization(house, expected, tmp_path, "first")


def test_kill9_during_rematerialization_of_a_partition(house, expected, tmp_path):
    """The same partition, already promoted, re-materialized and SIGKILLed mid-write: readers keep seeing
    the complete previous rows; the re-run replaces them exactly (no duplicates)."""
    ensure_partitions(house, [CAP_A])
    _kill9_materialization(house, expected, tmp_path, "again")


def _kill9_materialization(house: House, expected, tmp_path: Path, label: str) -> None:
    lake, cid = house.lake, CAP_A
    want = expected(cid)
    versions_before = {t: lake.version(t) for t in (*SYNTH_TABLES, "capability_specs")}
    promoted_before = {t: lake.promoted_version(t) for t in SYNTH_TABLES}
    log = tmp_path / f"child_{label}.log"
    proc = spawn(CHILD_MATERIALIZE, [house.dagster_home, house.lake_root, cid, "-"], log)
    kill9_when_data_appears(proc, [lake.uri(t) for t in SYNTH_TABLES], log)
    assert "RESULT" not in log.read_text()

    # Every table opens at a committed version; whatever is promoted for the partition is one complete write.
    crash_point = []
    for table in SYNTH_TABLES:
        v = lake.version(table)
        if v != versions_before[table]:
            crash_point.append(f"{table}@{v}")
        if v is None:
            continue
        assert versions_before[table] is None or v >= versions_before[table]
        latest = lake.read(table).filter(pl.col("capability_id") == cid)
        assert latest["_run_id"].n_unique() <= 1 and latest[SYNTH_IDS[table]].is_unique().all(), table
        if len(latest):
            assert sorted(latest[SYNTH_IDS[table]].to_list()) == expected_ids(want, table), f"{table}: partial rows visible"
        if lake.promoted_version(table) is not None:
            rows = lake.read_promoted(table)[0].filter(pl.col("capability_id") == cid)
            assert rows["_run_id"].n_unique() <= 1, table
            if promoted_before[table] is not None or len(rows):
                assert sorted(rows[SYNTH_IDS[table]].to_list()) == expected_ids(want, table), table
    assert lake.version("capability_specs") == versions_before["capability_specs"]
    FIGURES["kill9"].setdefault("asset_crash_points", []).append(", ".join(crash_point) or "before the first commit")

    # The re-run completes and leaves exactly the expected rows, once, promoted.
    res = materialize(house, list(SYNTH_TABLES), cid)
    assert res.success, failure_text(res)
    assert all(e.passed for e in res.get_asset_check_evaluations())
    writers = assert_partition_exact(lake, cid, want)
    assert set(writers.values()) == {res.run_id}
    assert_partition_exact(lake, cid, want, promoted=False)  # the latest version too
    _count("kill9", f"asset/{label}")


# ==================================================================================================
# 3. Concurrency at the asset level
# ==================================================================================================
def test_two_partitions_materialized_concurrently_lose_nothing(house, expected, tmp_path):
    ensure_partitions(house, [CAP_A])
    lake = house.lake
    a_before = {t: lake.read_promoted(t)[0].filter(pl.col("capability_id") == CAP_A).sort(SYNTH_IDS[t]) for t in SYNTH_TABLES}
    go = tmp_path / "go"
    logs = {cid: tmp_path / f"{cid}.log" for cid in (CAP_B, CAP_C)}
    procs = {cid: spawn(CHILD_MATERIALIZE, [house.dagster_home, house.lake_root, cid, go], logs[cid]) for cid in logs}
    try:
        deadline = time.monotonic() + 180
        while not all("READY" in logs[c].read_text(errors="replace") for c in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs.values()), \
                {c: logs[c].read_text(errors="replace")[-2000:] for c in logs}
            time.sleep(0.05)
        go.write_text("go")  # both start writing the same five tables at the same moment
        for cid, p in procs.items():
            p.wait(timeout=300)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            reap(p)
    for cid, p in procs.items():
        out = logs[cid].read_text(errors="replace")
        assert p.returncode == 0 and re.search(r"^RESULT True True ", out, re.M), out[-4000:]

    for cid in (CAP_B, CAP_C):
        assert_partition_exact(lake, cid, expected(cid))
        assert_partition_exact(lake, cid, expected(cid), promoted=False)
    for table in SYNTH_TABLES:
        promoted = lake.read_promoted(table)[0]
        assert promoted[SYNTH_IDS[table]].is_unique().all(), table
        a_now = promoted.filter(pl.col("capability_id") == CAP_A).sort(SYNTH_IDS[table])
        assert a_now.equals(a_before[table]), f"{table}: partition {CAP_A} changed"
        parts = set(lake.promotions(table).drop_nulls("partition")["partition"].to_list())
        assert {CAP_B, CAP_C} <= parts, table
    _count("concurrency", "asset/2 processes x 2 partitions x 5 tables")


# ==================================================================================================
# 3b. Hostile checkers inside a real materialization
# ==================================================================================================
class HostileBackend:
    """A generator whose documents carry hostile checkers (and keep carrying them after every revision)."""

    name = "hostile"
    version = "hostile-1"

    def __init__(self, probes: dict[int, str]):
        self.inner = EmbeddedBackend()
        self.probes = probes  # seed -> checker source planted in rubric item 0

    def _plant(self, d: Draft) -> Draft:
        return with_checker(d, self.probes[d.seed]) if d.seed in self.probes and d.spec is not None else d

    def draft(self, capability, seed):
        return self._plant(self.inner.draft(capability, seed))

    def revise(self, draft, diagnostics):
        return self._plant(self.inner.revise(draft, diagnostics))


class HostileGenerator(GeneratorResource):
    """The generator resource the synthesis asset builds its backend from, swapped for a hostile one."""

    lake_root: str = ""

    def build(self) -> Any:
        root, canary = Path(self.lake_root), Path(self.lake_root).parent / "pwned_by_asset"
        log = root / "validated_environments" / "_delta_log" / "00000000000000000000.json"
        return HostileBackend({
            1: f"def check(ev):\n    open({str(log)!r}, 'w').write('{{}}')\n    return True\n",
            2: f"import os\ndef check(ev):\n    raise ValueError(os.environ.get({SECRET_VAR!r}))\n",
            3: f"def check(ev):\n    __import__('os').system('touch {canary}')\n    return True\n",
            4: "def check(ev):\n    raise SystemExit(0)\n",
        })


def test_hostile_generator_through_the_synthesis_asset(house, monkeypatch):
    """Hostile checkers inside a real materialization: the run succeeds, the hostile environments land in
    rejected_environments with checker_* reasons, only clean ones are promoted, the lake stays intact."""
    monkeypatch.setenv(SECRET_VAR, SECRET)
    lake = house.lake
    profile = {**SMOKE_PROFILE, "envs_per_capability": 5, "max_repair_rounds": 1}
    v_specs = lake.version("capability_specs")
    res = materialize(house, list(SYNTH_TABLES), CAP_HOSTILE, profile=profile, generator=HostileGenerator(lake_root=house.lake_root))
    assert res.success, failure_text(res)
    assert all(e.passed for e in res.get_asset_check_evaluations())
    rejected = lake.read_promoted("rejected_environments")[0].filter(pl.col("capability_id") == CAP_HOSTILE)
    by_seed = {r["seed"]: r for r in rejected.iter_rows(named=True)}
    assert set(by_seed) >= {1, 2, 3, 4}, sorted(by_seed)
    for seed in (1, 2, 3, 4):
        assert any(c.startswith("checker_") for c in by_seed[seed]["codes"]), by_seed[seed]["codes"]
        _count("probes", "synthesis_asset")
    validated = lake.read_promoted("validated_environments")[0].filter(pl.col("capability_id") == CAP_HOSTILE)
    assert set(validated["seed"].to_list()) <= {0}, "a hostile environment was promoted"
    for table in SYNTH_TABLES:  # the secret reached no table (diagnostics are persisted in several)
        df = lake.read(table)
        for col, dtype in df.schema.items():
            if dtype == pl.String:
                assert not df[col].str.contains(SECRET, literal=True).any(), (table, col)
    assert not (Path(house.lake_root).parent / "pwned_by_asset").exists()
    for table in SYNTH_TABLES:  # every committed version, from the first (the probe's target) on, still reads
        for v in range(lake.version(table) + 1):
            lake.read(table, version=v)
    assert lake.version("capability_specs") == v_specs


# ==================================================================================================
# 4. Contamination gate and determinism across the full pipeline tables
# ==================================================================================================
def test_contamination_gate_cannot_be_bypassed_by_rematerializing_downstream(house, sandbox, monkeypatch):
    ensure_partitions(house, [CAP_A, CAP_B, CAP_C])
    lake = house.lake
    res = materialize(house, ["environment_splits", "teacher_trajectories", "demonstrations"])
    assert res.success, failure_text(res)
    splits = lake.read_promoted("environment_splits")[0]
    envs = lake.read_promoted("validated_environments")[0]
    held = splits.filter(pl.col("split") != "train").sort("env_id")
    assert set(held["split"]) >= {"heldout_capability"}
    # one held-out environment per held-out kind, solved by the teacher, labelled "train" by the forger
    picks = held.group_by("split", maintain_order=True).head(1)
    specs = {r: EnvironmentSpec.from_json(s) for r, s in envs.select("env_id", "spec_json").iter_rows()}
    planted = collect_teacher_trajectories([(specs[e], "train") for e in picks["env_id"]], sandbox, fault_rate=0.0, seed=77)
    assert planted["passed"].all(), "the planted trajectories must pass their checkers (else curate drops them anyway)"
    v = lake.write("teacher_trajectories", planted, lineage=Lineage.local("forger"), mode="append")
    lake.promote("teacher_trajectories", v, run_id="forger", checks={"forged": True})
    assert set(planted["traj_id"]) <= set(lake.read_promoted("teacher_trajectories")[0]["traj_id"])

    v_demos = lake.promoted_version("demonstrations")
    again = materialize(house, ["demonstrations"])  # downstream alone
    assert again.success, failure_text(again)
    demos, v_new = lake.read_promoted("demonstrations")
    assert v_new > v_demos
    assert not set(demos["traj_id"]) & set(planted["traj_id"]), "a held-out trajectory became a demonstration"
    assert not set(demos["env_id"]) & set(held["env_id"])
    mat = next(e.materialization for e in again.get_asset_materialization_events() if e.asset_key == dg.AssetKey("demonstrations"))
    assert mat.metadata["dropped_heldout_lineage"].value + mat.metadata["dropped_not_train"].value >= len(planted)

    # Forced in anyway (a curate that trusts the forged split column): the audit flags it and the blocking
    # check fails, so the version is never promoted.
    forged_splits = splits.with_columns(split=pl.lit("train"))
    forced, _ = curate(lake.read_promoted("teacher_trajectories")[0], forged_splits, max_chars=10**9)
    assert set(planted["env_id"]) <= set(forced["env_id"])
    audit = contamination_audit(forced, splits).filter(pl.col("env_id").is_in(planted["env_id"].to_list()))
    assert audit["heldout_env"].all()
    assert audit.filter(pl.col("capability_id") == CAP_C)["heldout_capability"].all()
    import assets.models as models

    monkeypatch.setattr(models, "curate", lambda trajs, _splits, **kw: curate(trajs, forged_splits, max_chars=10**9))
    v_promoted = lake.promoted_version("demonstrations")
    bad = materialize(house, ["demonstrations"])
    checks = {e.asset_check_key.name: e for e in bad.get_asset_check_evaluations()}
    assert not checks["demonstrations_quality"].passed
    assert "heldout" in checks["demonstrations_quality"].metadata["summary"].value
    assert lake.version("demonstrations") > v_promoted  # written (audit trail) ...
    assert lake.promoted_version("demonstrations") == v_promoted  # ... but never published
    assert not set(lake.read_promoted("demonstrations")[0]["env_id"]) & set(held["env_id"])
    FIGURES["bad_input"].add("forged teacher trajectory of a held-out environment")


def test_same_seed_same_tables_across_processes(house, expected):
    """The partitions written by child processes (other hash seeds) equal this process's run_synthesis
    byte for byte: spec_json, spec_hash and every verdict column; and a second in-process run agrees."""
    ensure_partitions(house, [CAP_A, CAP_B])
    for cid in (CAP_A, CAP_B):
        assert_partition_exact(house.lake, cid, expected(cid))
    p = ProfileResource(**SMOKE_PROFILE)
    with Sandbox(workers=1) as box:
        twice = run_synthesis(CATALOG[CAP_B], range(p.envs_per_capability), EmbeddedBackend(),
                              Validator(box, fault_rate=p.validation_fault_rate), max_rounds=p.max_repair_rounds)
    first = expected(CAP_B)
    assert twice.validated.equals(first.validated)
    assert twice.drafts.equals(first.drafts)
    assert twice.rejected.equals(first.rejected)
    assert twice.repair_log.drop("seconds").equals(first.repair_log.drop("seconds"))


# ==================================================================================================
# 5. Bad input: each fails clearly, naming the culprit, and loses nothing
# ==================================================================================================
def _copy_lake(house: House, dst: Path) -> Lake:
    shutil.copytree(house.lake_root, dst)
    return Lake(dst)


def test_missing_upstream_table_fails_the_asset_naming_it(house, tmp_path):
    empty = str(tmp_path / "empty_lake")
    res = materialize(house, ["environment_splits"], lake_root=empty)
    assert not res.success
    text = failure_text(res)
    assert "validated_environments" in text and "does not exist" in text, text[-2000:]
    assert not Lake(empty).exists("environment_splits")
    FIGURES["bad_input"].add("missing upstream table")


@pytest.mark.parametrize("damage", ["corrupt_commit", "missing_data_file", "corrupt_promotions_log"])
def test_corrupt_upstream_table_fails_the_asset_naming_it(house, tmp_path, damage):
    ensure_partitions(house, [CAP_A])
    if not house.lake.exists("environment_splits"):
        assert materialize(house, ["environment_splits"]).success
    lake = _copy_lake(house, tmp_path / "lake")
    victim = {"corrupt_commit": "validated_environments", "missing_data_file": "validated_environments",
              "corrupt_promotions_log": PROMOTIONS}[damage]
    v = lake.promoted_version("validated_environments")
    if damage == "corrupt_commit":
        Path(lake.uri(victim), "_delta_log", f"{v:020d}.json").write_text("{garbage")
    elif damage == "missing_data_file":
        df = lake.read(victim, version=v)
        from deltalake import DeltaTable

        for f in DeltaTable(lake.uri(victim), version=v).file_uris():
            os.remove(f)
        assert len(df)
    else:
        for f in glob.glob(os.path.join(lake.uri(victim), "_delta_log", "*")):
            if os.path.isfile(f):  # every commit and checkpoint (a checkpoint would otherwise stand in for a commit)
                Path(f).write_text("{garbage")
    others = [t for t in ("capability_specs", "repair_log", "environment_drafts") if t != victim]
    before = {t: tree_state(Path(lake.uri(t))) for t in others}
    splits_before = lake.version("environment_splits") if victim != PROMOTIONS else None
    res = materialize(house, ["environment_splits"], lake_root=lake.root)
    assert not res.success
    text = failure_text(res)
    assert f"'{victim}'" in text and re.search("corrupt|unreadable", text), text[-3000:]
    for t in others:  # the other tables are untouched (and still readable)
        assert tree_state(Path(lake.uri(t))) == before[t], t
        if victim != PROMOTIONS:
            assert len(lake.read(t)) > 0
    if splits_before is not None:
        assert lake.version("environment_splits") == splits_before
    FIGURES["bad_input"].add(f"upstream table: {damage.replace('_', ' ')}")


def test_invalid_environment_document_in_the_lake_fails_naming_env_and_table(house, tmp_path):
    ensure_partitions(house, [CAP_A])
    if not house.lake.exists("environment_splits"):
        assert materialize(house, ["environment_splits"]).success
    lake = _copy_lake(house, tmp_path / "lake")
    splits = lake.read_promoted("environment_splits")[0]
    env_id = splits.filter((pl.col("split") == "train") & (pl.col("capability_id") == CAP_A))["env_id"][0]
    envs = lake.read_promoted("validated_environments")[0].filter(pl.col("capability_id") == CAP_A)
    broken = envs.with_columns(spec_json=pl.when(pl.col("env_id") == env_id).then(pl.col("spec_json").str.slice(0, 100))
                               .otherwise(pl.col("spec_json"))).drop(list(LINEAGE_COLUMNS))
    v = lake.write("validated_environments", broken, lineage=Lineage.local("t"), mode="overwrite",
                   replace_where=f"capability_id = '{CAP_A}'")
    lake.promote("validated_environments", v, run_id="t", partition=CAP_A, partition_column="capability_id")
    res = materialize(house, ["teacher_trajectories"], lake_root=lake.root)
    assert not res.success
    text = failure_text(res)
    assert env_id in text and "validated_environments" in text, text[-2000:]


def test_broken_capability_file_fails_the_asset_and_keeps_the_promoted_catalog(house, tmp_path):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    for cid in (CAP_A, CAP_B):
        shutil.copy(Path(CATALOG_DIR) / f"{cid}.yaml", catalog)
    lake_root = str(tmp_path / "lake")
    profile = {**SMOKE_PROFILE, "catalog_dir": str(catalog)}
    assert materialize(house, ["capability_specs"], lake_root=lake_root, profile=profile).success
    v = Lake(lake_root).promoted_version("capability_specs")
    text = (catalog / f"{CAP_B}.yaml").read_text()
    (catalog / f"{CAP_B}.yaml").write_text(re.sub(r"(?m)^services:.*$", "services: [mail, fax]", text, count=1))
    res = materialize(house, ["capability_specs"], lake_root=lake_root, profile=profile)
    assert not res.success
    msg = failure_text(res)
    assert re.search(rf"{CAP_B}\.yaml:\d+: services:.*unknown service.*fax", msg), msg[-2000:]  # file, line, field, value
    assert Lake(lake_root).promoted_version("capability_specs") == v == Lake(lake_root).version("capability_specs")
    FIGURES["bad_input"].add("malformed capability YAML (asset level)")


def test_invalid_environment_spec_json_gives_a_pydantic_error_naming_the_field(good_draft):
    doc = json.loads(good_draft.spec.to_json())
    cases = {
        "truncated": (good_draft.spec.to_json()[:150], "Invalid JSON"),
        "wrong type": (json.dumps({**doc, "seed": "seven"}), "seed"),
        "missing field": (json.dumps({k: v for k, v in doc.items() if k != "rubric"}), "rubric"),
        "bad rubric item": (json.dumps({**doc, "rubric": [{"id": "x"}]}), "rubric.0.kind"),
        "bad literal": (json.dumps({**doc, "rubric": [{**doc["rubric"][0], "kind": "bonus"}]}), "rubric.0.kind"),
        "unknown field": (json.dumps({**doc, "backdoor": True}), "backdoor"),
        "not an object": ("[1, 2, 3]", "EnvironmentSpec"),
    }
    from pydantic import ValidationError

    for name, (text, culprit) in cases.items():
        with pytest.raises(ValidationError) as err:
            EnvironmentSpec.from_json(text)
        assert culprit in str(err.value), (name, str(err.value)[:500])
    FIGURES["bad_input"].add("invalid EnvironmentSpec JSON")


def test_unknown_tools_in_a_spec_are_diagnosed_by_name(good_draft, sandbox):
    doc = json.loads(good_draft.spec.to_json())
    v = Validator(sandbox)

    def cert(edit: Callable[[dict], None]) -> Certification:
        d = copy.deepcopy(doc)
        edit(d)
        return v.certify(replace(good_draft, spec=EnvironmentSpec.model_validate(d)))

    c = cert(lambda d: d["turns"][-1]["events"].append({"tool": "fax_receive", "args": {"id": "f1"}}))
    assert not c.certified and any(x.code == "unknown_tool" and "fax_receive" in x.message for x in c.diagnostics)
    c = cert(lambda d: d["reference"][0]["steps"].insert(0, {"tool": "fax_send", "args": {}}))
    assert not c.certified and any(x.code == "unexposed_tool" and "fax_send" in x.message for x in c.diagnostics)
    assert any("fax_send" in x.message for x in c.diagnostics if x.code == "reference_incomplete")
    FIGURES["bad_input"].add("unknown tools in a spec (events, reference)")


def test_world_collection_of_an_unknown_service_is_diagnosed(good_draft, sandbox):
    doc = json.loads(good_draft.spec.to_json())
    doc["world"]["fax.pages"] = {"p1": {"id": "p1", "text": "hello"}}
    c = Validator(sandbox).certify(replace(good_draft, spec=EnvironmentSpec.model_validate(doc)))
    assert not c.certified and any("fax" in d.message for d in c.diagnostics)


def _not_a_model(tmp_path: Path) -> dict[str, Path]:
    empty = tmp_path / "empty"
    empty.mkdir()
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    (garbage / "model.safetensors").write_bytes(b"\x00" * 64)
    (garbage / "tokenizer.json").write_text("{}")
    (tmp_path / "file.bin").write_bytes(b"x")
    return {"missing": tmp_path / "nope", "file": tmp_path / "file.bin", "empty": empty, "garbage": garbage}


def test_checkpoint_that_is_not_a_model_gives_a_clear_error_naming_the_path(tmp_path, capsys):
    from assets.cli import main as cowork
    from cowork_pipeline.agents.hf_agent import HFAgent
    from cowork_pipeline.training.sft import train_sft

    for kind, path in _not_a_model(tmp_path).items():
        entries = [("HFAgent", lambda: HFAgent(path)),
                   ("train_sft", lambda: train_sft(path, [{"messages": [], "tools": []}], tmp_path / "out"))]
        for entry, call in entries:
            with pytest.raises(CheckpointError) as err:
                call()
            assert str(path) in str(err.value), (kind, entry, str(err.value))
        # the command says it in one line on stderr (exit 1), not as a traceback
        assert cowork(["serve", str(path)]) == 1, kind
        err = capsys.readouterr().err
        assert err.startswith("cowork serve: ") and str(path) in err and err.count("\n") == 1, (kind, err)
    assert not (tmp_path / "out").exists()  # nothing written for a bad base
    FIGURES["bad_input"].add("checkpoint dir that is not a model (HFAgent, train_sft, cowork serve)")


def test_sft_asset_with_a_non_model_base_checkpoint_fails_naming_it(house, tmp_path):
    lake = house.lake
    if lake.promoted_version("demonstrations") is None:
        ensure_partitions(house, [CAP_A, CAP_B])
        assert materialize(house, ["environment_splits", "teacher_trajectories", "demonstrations"]).success
    bad = _not_a_model(tmp_path)["empty"]
    v_ckpt = lake.version("checkpoints")
    res = materialize(house, ["sft_checkpoint", "checkpoints"], profile={**SMOKE_PROFILE, "base_checkpoint": str(bad)})
    assert not res.success
    assert str(bad) in failure_text(res)
    assert lake.version("checkpoints") == v_ckpt


# ==================================================================================================
# 6. Property-based: the validator never raises on a mutated or truncated document, it diagnoses
# ==================================================================================================
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                      st.text(max_size=12), st.sampled_from(["fax_send", "mail_send", "crm.contacts", "{\"$var\": \"x\"}", ""]))
JSON_VALUE = st.recursive(JSON_LEAF, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
                          max_leaves=6)
FREE_FORM = ("world", "facts", "difficulty")  # dict[str, Any] areas pydantic does not type


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _at(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _mutate(data: st.DataObject, doc: dict, allowed: Callable[[tuple], bool]) -> list[str]:
    done = []
    for _ in range(data.draw(st.integers(1, 3), label="n_mutations")):
        paths = [p for p in _paths(doc) if p and allowed(p)]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        parent, key = _at(doc, path[:-1]), path[-1]
        op = data.draw(st.sampled_from(["delete", "replace", "swap", "duplicate", "truncate"]), label="op")
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = data.draw(JSON_VALUE, label="value")
        elif op == "swap":  # a value of the right shape from elsewhere in the document: ids, tool names, records
            other = data.draw(st.sampled_from(paths), label="other")
            parent[key] = copy.deepcopy(_at(doc, other)) if other[:len(path)] != path else None
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif op == "truncate" and isinstance(parent[key], str):
            parent[key] = parent[key][: data.draw(st.integers(0, len(parent[key])), label="cut")]
        done.append(f"{op} {'/'.join(map(str, path))}")
    return done


def _certify_text(validator: Validator, text: str, draft: Draft) -> Certification:
    """The path every untrusted document takes: parse (LLM backend's parser), then certify."""
    cap = CATALOG[draft.capability_id]
    spec, diags, _ = parse_spec(text, cap, draft.seed, attempt=0, model="fuzz", prompt_version="v1")
    return validator.certify(Draft(cap.id, draft.seed, 0, "fuzz", spec, parse_diagnostics=diags, capability=cap))


def _assert_diagnosed(cert: Certification) -> None:
    assert isinstance(cert, Certification)
    assert cert.certified == (not cert.diagnostics)
    for d in cert.diagnostics:
        assert re.fullmatch(r"[a-z_]+", d.code) and isinstance(d.message, str) and d.message, d


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_property_validator_diagnoses_mutated_documents(data, good_draft, sandbox):
    """Mutations of the typed parts of a certified document (tools, turns, events, rubric, reference...)."""
    doc = json.loads(good_draft.spec.to_json())
    _mutate(data, doc, lambda p: p[0] not in FREE_FORM)
    _assert_diagnosed(_certify_text(Validator(sandbox), json.dumps(doc), good_draft))
    _count("hypothesis", "mutated spec documents (typed fields): validator never raises")


@settings(max_examples=60, deadline=None, database=None, report_multiple_bugs=False,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_property_validator_diagnoses_mutated_free_form_parts(data, good_draft, sandbox):
    _count("hypothesis", "mutated spec documents (world/facts/difficulty): validator never raises")
    doc = json.loads(good_draft.spec.to_json())
    _mutate(data, doc, lambda p: p[0] in FREE_FORM)
    _assert_diagnosed(_certify_text(Validator(sandbox), json.dumps(doc), good_draft))


@pytest.mark.parametrize("edit", [
    pytest.param(lambda d: next(iter(d["world"]["crm.contacts"].values())).pop("email"), id="contact-without-email"),
    pytest.param(lambda d: next(iter(d["world"]["directory.people"].values())).update(email=None), id="person-email-null"),
    pytest.param(lambda d: d["facts"].update(mentions=["Clara"]), id="mention-not-an-object"),
    pytest.param(lambda d: d["difficulty"].update(distractors=None), id="difficulty-null"),
])
def test_validator_diagnoses_plausible_llm_slips_in_free_form_parts(edit, good_draft, sandbox):
    """Minimal documents the property found: slips an LLM generator plausibly makes."""
    doc = json.loads(good_draft.spec.to_json())
    edit(doc)
    _assert_diagnosed(_certify_text(Validator(sandbox), json.dumps(doc), good_draft))


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "repeatable") != "repeatable", reason="exploring: new draws wanted")
def test_property_tests_draw_the_same_examples_every_run() -> None:
    """CI is red for the change under test only: a property test (without settings of its own about it) draws the
    same examples each time it runs, under the profile tests/conftest.py loads."""
    drawn: list[list] = []

    @settings(max_examples=25)
    @given(st.lists(st.text(max_size=5)), st.integers())
    def prop(texts: list[str], n: int) -> None:
        drawn[-1].append((texts, n))

    for _ in range(3):
        drawn.append([])
        prop()
    assert len(drawn[0]) >= 10 and drawn[0] == drawn[1] == drawn[2]


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(cut=st.floats(0, 1), junk=st.text(max_size=20), where=st.floats(0, 1), fence=st.booleans())
def test_property_truncated_or_spliced_document_text_is_diagnosed(cut, junk, where, fence, good_draft, sandbox):
    text = good_draft.spec.to_json()
    text = text[: int(len(text) * cut)]
    at = int(len(text) * where)
    text = text[:at] + junk + text[at:]
    if fence:
        text = f"Here is the environment:\n```json\n{text}\n```"
    cert = _certify_text(Validator(sandbox), text, good_draft)
    _assert_diagnosed(cert)
    if cut < 0.95:  # a cut document never certifies
        assert not cert.certified and codes(cert) & {"unparseable_output", "schema_invalid"}, codes(cert)
    _count("hypothesis", "truncated/spliced document text: parse + certify never raise")


# ==================================================================================================
# 7. The figures
# ==================================================================================================
def _count_tests(path: Path, select: Callable[[str], bool] = lambda name: True) -> int:
    """Test cases a module defines (parametrized cases counted), without a pytest sub-session."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_reliability_count_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    n = 0
    for name, fn in vars(module).items():
        if name.startswith("test_") and callable(fn) and select(name):
            k = 1
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == "parametrize":
                    k *= len(list(mark.args[1]))
            n += k
    return n


def test_zz_reliability_figures(capsys):
    sandbox_tests = _count_tests(ROOT / "tests" / "test_sandbox.py")
    probes = FIGURES["probes"]
    rows = [
        ("sandbox escape probes, Sandbox level (tests/test_sandbox.py)", sandbox_tests),
        *[(f"sandbox escape probes, end to end: {k}", v) for k, v in sorted(probes.items())],
        ("kill -9 crash cases survived", sum(FIGURES["kill9"].get(k, 0) for k in FIGURES["kill9"] if k != "asset_crash_points")),
        *[(f"  kill -9: {k}", v) for k, v in sorted(FIGURES["kill9"].items()) if k != "asset_crash_points"],
        *[(f"  asset crash point {i + 1}", p) for i, p in enumerate(FIGURES["kill9"].get("asset_crash_points", []))],
        ("concurrency cases", sum(FIGURES["concurrency"].values())),
        ("bad-input classes (this module)", len(FIGURES["bad_input"])),
        *[(f"  {c}", "") for c in sorted(FIGURES["bad_input"])],
        *[(f"hypothesis examples: {k}", v) for k, v in sorted(FIGURES["hypothesis"].items())],
    ]
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
    with capsys.disabled():
        print("\n\nReliability figures\n" + "-" * (width + 8) + "\n" + table + "\n")
    assert sandbox_tests > 0
